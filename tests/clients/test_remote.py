"""Remote sources: `qem` and `semq` read `s3://` and `http(s)://` inputs,
fetching only what each answer needs, against real servers started here on
127.0.0.1 (never any other address):

- S3: moto's server (`moto_server`), with IAM authentication for the
  credential cases;
- HTTP with Range: RangeHTTPServer's handler, counting what it serves and
  able to fail, cut short or replace its file on cue;
- HTTP without Range: Python's own `http.server`.

Every output is compared with the same command on the local copy.
"""

import errno
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from RangeHTTPServer import RangeRequestHandler

from conftest import REPO, can_mount, qem_from_array, run

EXAMPLES = REPO / "examples" / "data"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def server_process(args, env=None):
    """A server started as its own process, its log in a file (a pipe
    nobody reads would fill and stop the server), and the port it was told."""
    port = free_port()
    log = open(f"/tmp/qemfs-test-server-{port}.log", "w+b")
    proc = subprocess.Popen([*map(str, args(port))], stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log = log
    wait_for_port(port, proc)
    return proc, port


def stop(proc):
    proc.terminate()
    proc.wait(10)
    proc.log.close()
    os.unlink(proc.log.name)


def wait_for_port(port: int, proc=None, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            proc.log.seek(0)
            raise AssertionError(f"the server exited {proc.returncode}: {proc.log.read().decode(errors='replace')}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {LOOPBACK}:{port} after {seconds} s")


class Served:
    """What the counting server saw, and what it is told to do."""

    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.bytes = 0
            self.requests = []
            self.fail_next = 0
            self.cut_next = 0
            self.replace_after = None

    def total(self, name):
        with self.lock:
            return sum(n for (method, path, n) in self.requests if path.endswith(name))

    def count(self, name):
        with self.lock:
            return len([r for r in self.requests if r[1].endswith(name)])


def counting_handler(served: Served):
    class Handler(RangeRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served.root), **kwargs)

        def log_message(self, *args):
            pass

        def send_head(self):
            with served.lock:
                fail = served.fail_next > 0
                if fail:
                    served.fail_next -= 1
            if fail:
                self.send_error(503, "Slow down")
                return None
            return super().send_head()

        def do_HEAD(self):
            with served.lock:
                served.requests.append(("HEAD", self.path, 0))
            super().do_HEAD()

        def copyfile(self, source, outputfile):
            class Counting:
                def __init__(self):
                    self.n = 0

                def write(self, data):
                    with served.lock:
                        limit = served.cut_next
                    if limit and self.n + len(data) > limit:
                        outputfile.write(data[: limit - self.n])
                        self.n = limit
                        raise ConnectionAbortedError("cut short on purpose")
                    outputfile.write(data)
                    self.n += len(data)

            counting = Counting()
            try:
                super().copyfile(source, counting)
            finally:
                with served.lock:
                    served.bytes += counting.n
                    served.requests.append(("GET", self.path, counting.n))
                    if counting.n and served.cut_next:
                        served.cut_next = 0
                        self.close_connection = True
                    replace = served.replace_after
                    if replace and replace[0] == len([r for r in served.requests if r[0] == "GET"]):
                        served.replace_after = None
                        replace[1]()

    return Handler


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The bundled examples and one acquisition whose body is larger than
    the first range a remote open fetches (1 MiB)."""
    root = tmp_path_factory.mktemp("served")
    for f in EXAMPLES.iterdir():
        shutil.copy(f, root / f.name)
    rng = np.random.default_rng(46)
    counts = rng.poisson(3.0, size=(32, 32, 96, 96)).astype(np.uint16)
    (root / "work").mkdir()
    made = qem_from_array(root / "work", counts, "large.qem")
    shutil.move(made, root / "large.qem")
    shutil.rmtree(root / "work")
    assert (root / "large.qem").stat().st_size > 3 << 20
    return root


@pytest.fixture(scope="module")
def http_range(files):
    served = Served(files)
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), counting_handler(served))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://{LOOPBACK}:{server.server_address[1]}"
    yield served
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def http_plain(files):
    """Python's `http.server`, which answers every GET with the whole file."""
    proc, port = server_process(
        lambda port: [sys.executable, "-m", "http.server", port, "--bind", LOOPBACK, "--directory", files]
    )
    yield f"http://{LOOPBACK}:{port}"
    stop(proc)


def moto_server(env_extra=None):
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: scripts/setup.sh installs moto[server] into .venv")
    env = dict(os.environ, **(env_extra or {}))
    proc, port = server_process(lambda port: [exe, "-H", LOOPBACK, "-p", port], env=env)
    return proc, f"http://{LOOPBACK}:{port}"


@pytest.fixture(scope="module")
def s3(files):
    """moto's S3 with every file under `lab/acq/`; no authentication."""
    import boto3

    proc, endpoint = moto_server()
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    client.create_bucket(Bucket="lab")
    for f in files.iterdir():
        client.upload_file(str(f), "lab", f"acq/{f.name}")
    yield endpoint
    stop(proc)


def s3_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    return env


def remote_and_local(tool, args, url_of, env=None):
    """Runs `tool args` with URLs and with the local copies; both outputs,
    the remote one with its URLs written as the local paths."""
    remote_args = [url_of(a) if isinstance(a, Path) else a for a in args]
    remote = run(tool, *remote_args, check=False, env=env)
    local = run(tool, *args, check=False, env=env)
    text = remote.stdout.decode()
    for a, r in zip(args, remote_args):
        if isinstance(a, Path):
            text = text.replace(r, str(a))
    return remote, local, text


CASES = [
    ("qem", ["show", "scan-u16.qem"]),
    ("qem", ["show", "--json", "large.qem"]),
    ("qem", ["show", "derived-scaled.qem"]),
    ("qem", ["validate", "scan-u16.qem", "empad-f32.qem", "derived-scaled.qem", "large.qem"]),
    ("qem", ["validate", "--quick", "large.qem"]),
    ("qem", ["hash", "scan-u16.qem", "empad-f32.qem", "large.qem"]),
    ("qem", ["hash", "--file", "scan-u16.qem", "large.qem"]),
    ("qem", ["diff", "scan-u16.qem", "large.qem"]),
    ("qem", ["diff", "--json", "empad-f32.qem", "empad-f32.qem"]),
    ("semq", ["show", "embeddings.semq"]),
    ("semq", ["validate", "embeddings.semq"]),
    ("semq", ["hash", "embeddings.semq"]),
    ("semq", ["diff", "embeddings.semq", "embeddings.semq"]),
    ("semq", ["floor", "embeddings.semq", "embeddings.semq", "embeddings.semq", "embeddings.semq"]),
]


@pytest.mark.parametrize("store", ["http", "s3"])
@pytest.mark.parametrize("tool,args", CASES, ids=[" ".join([t] + a) for t, a in CASES])
def test_every_output_equals_the_local_files(files, http_range, s3, store, tool, args):
    if store == "http":
        url_of = lambda p: f"{http_range.url}/{p.name}"  # noqa: E731
        flags, env = [], None
    else:
        url_of = lambda p: f"s3://lab/acq/{p.name}"  # noqa: E731
        flags, env = ["--endpoint-url", s3], s3_env()
    paths = [files / a if a.endswith((".qem", ".semq")) else a for a in args]
    remote, local, text = remote_and_local(tool, [*paths, *flags], url_of, env=env)
    assert remote.returncode == local.returncode, remote.stderr.decode()
    assert local.returncode in (0, 1), local.stderr.decode()
    assert text == local.stdout.decode()
    assert remote.stderr == local.stderr


def test_qem_show_fetches_the_header_alone(files, http_range):
    large = files / "large.qem"
    header_end = 56 + int.from_bytes(large.read_bytes()[8:16], "little")
    http_range.reset()
    out = run("qem", "show", f"{http_range.url}/large.qem")
    assert b"32 x 32 x 96 x 96" in out.stdout
    fetched = http_range.total("large.qem")
    requests = http_range.count("large.qem")
    print(f"qem show: {fetched} of {large.stat().st_size} bytes in {requests} requests")
    assert fetched <= header_end + (1 << 20)
    assert fetched < large.stat().st_size / 2
    # The header fits in the first MiB: the opening request is the only one.
    assert requests == 1


def test_a_whole_read_fetches_each_byte_once(files, http_range):
    large = files / "large.qem"
    http_range.reset()
    run("qem", "validate", f"{http_range.url}/large.qem")
    fetched = http_range.total("large.qem")
    print(f"qem validate: {fetched} bytes fetched for a {large.stat().st_size}-byte file")
    assert large.stat().st_size <= fetched <= 1.1 * large.stat().st_size


def test_a_server_that_ignores_range_is_refused(files, http_plain):
    for tool, name in [("qem", "large.qem"), ("qem", "scan-u16.qem"), ("semq", "embeddings.semq")]:
        out = run(tool, "validate", f"{http_plain}/{name}", check=False)
        assert out.returncode == 2
        # validate names each file and its verdict on stdout
        err = out.stdout.decode() + out.stderr.decode()
        assert f"{http_plain}/{name}" in err
        assert "does not support Range requests" in err


def test_missing_objects_and_buckets_are_named(files, http_range, s3):
    cases = [
        (["show", f"{http_range.url}/missing.qem"], "no such object (HTTP 404)"),
        (["show", "s3://lab/acq/missing.qem", "--endpoint-url", s3], "no such object (HTTP 404)"),
        (["show", "s3://nobucket/scan.qem", "--endpoint-url", s3], "no such bucket 'nobucket'"),
        (["show", "s3://lab/acq/", "--endpoint-url", s3], "names a bucket or a prefix"),
        (["show", "s3:///scan.qem"], "no bucket"),
        (["hash", "--file", f"{http_range.url}/missing.qem"], "no such object (HTTP 404)"),
    ]
    for args, reason in cases:
        out = run("qem", *args, check=False, env=s3_env())
        assert out.returncode == 2, args
        err = out.stderr.decode()
        assert reason in err, err
        assert "os error" not in err, err
    out = run("semq", "show", "s3://nobucket/e.semq", "--endpoint-url", s3, check=False, env=s3_env())
    assert out.returncode == 2 and "no such bucket 'nobucket'" in out.stderr.decode()


def test_credentials(files, tmp_path):
    """With IAM authentication on: the right keys read, wrong ones and
    none are refused in words, and a profile file is read."""
    import boto3

    # The first four actions (the user, its policy, its key) go unchecked.
    proc, endpoint = moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        anon = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
        iam = boto3.client("iam", **anon)
        iam.create_user(UserName="scientist")
        policy = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
        arn = iam.create_policy(PolicyName="all", PolicyDocument=policy)["Policy"]["Arn"]
        iam.attach_user_policy(UserName="scientist", PolicyArn=arn)
        key = iam.create_access_key(UserName="scientist")["AccessKey"]
        good = dict(AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=good["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=good["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket="lab")
        client.upload_file(str(files / "scan-u16.qem"), "lab", "scan-u16.qem")
        url = "s3://lab/scan-u16.qem"
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        base["HOME"] = str(tmp_path)
        local = run("qem", "hash", files / "scan-u16.qem").stdout.split()[0]

        out = run("qem", "hash", url, "--endpoint-url", endpoint, env=dict(base, **good))
        assert out.stdout.split()[0] == local

        wrong = dict(good, AWS_SECRET_ACCESS_KEY="not-the-secret")
        out = run("qem", "show", url, "--endpoint-url", endpoint, check=False, env=dict(base, **wrong))
        assert out.returncode == 2
        assert "credentials were refused (SignatureDoesNotMatch" in out.stderr.decode(), out.stderr.decode()

        unknown = dict(AWS_ACCESS_KEY_ID="AKIANOBODY", AWS_SECRET_ACCESS_KEY="x")
        out = run("qem", "show", url, "--endpoint-url", endpoint, check=False, env=dict(base, **unknown))
        assert out.returncode == 2
        assert "credentials were refused (InvalidAccessKeyId" in out.stderr.decode(), out.stderr.decode()

        out = run("qem", "show", url, "--endpoint-url", endpoint, check=False, env=base)
        assert out.returncode == 2
        assert "no AWS credentials found" in out.stderr.decode()

        # The AWS way: a named profile in ~/.aws, the endpoint in its config.
        aws = tmp_path / ".aws"
        aws.mkdir()
        (aws / "credentials").write_text(
            f"[default]\naws_access_key_id = AKIANOBODY\naws_secret_access_key = x\n\n"
            f"[lab]\naws_access_key_id = {good['AWS_ACCESS_KEY_ID']}\naws_secret_access_key = {good['AWS_SECRET_ACCESS_KEY']}\n"
        )
        (aws / "config").write_text(f"[profile lab]\nregion = us-east-1\nendpoint_url = {endpoint}\n")
        out = run("qem", "hash", url, env=dict(base, AWS_PROFILE="lab"))
        assert out.stdout.split()[0] == local
    finally:
        stop(proc)


def test_failures_are_retried_and_bounded(files, http_range):
    url = f"{http_range.url}/scan-u16.qem"
    local = run("qem", "hash", files / "scan-u16.qem").stdout.split()[0]
    # Two 503 answers, then the server recovers: retried, and the answer is right.
    http_range.reset()
    http_range.fail_next = 2
    out = run("qem", "hash", url)
    assert out.stdout.split()[0] == local
    # A server that keeps failing: exit 2 within the retry window, in words.
    http_range.reset()
    http_range.fail_next = 1000
    start = time.monotonic()
    out = run("qem", "hash", url, check=False)
    http_range.reset()
    assert out.returncode == 2
    assert "the server kept failing" in out.stderr.decode(), out.stderr.decode()
    assert time.monotonic() - start < 30
    # Nothing listening.
    out = run("qem", "show", f"http://{LOOPBACK}:{free_port()}/scan.qem", check=False)
    assert out.returncode == 2
    assert "the server cannot be reached" in out.stderr.decode()


def test_a_body_cut_short_is_refused_or_fetched_again(files, http_range):
    """A response cut off mid-body never yields a wrong answer."""
    url = f"{http_range.url}/large.qem"
    local = run("qem", "hash", files / "large.qem").stdout.split()[0]
    http_range.reset()
    http_range.cut_next = 100_000
    out = run("qem", "hash", url, check=False)
    http_range.reset()
    if out.returncode == 0:
        assert out.stdout.split()[0] == local
    else:
        assert out.returncode == 2 and url in out.stderr.decode()


def test_an_object_replaced_while_read_is_refused(files, http_range, tmp_path):
    """The object is replaced by another acquisition of the same size after
    its header was fetched: the body read is refused (its version changed),
    never decoded from two files."""
    victim = files / "victim.qem"
    shutil.copy(files / "large.qem", victim)
    stat = victim.stat()
    other = bytearray(victim.read_bytes())
    other[-1000] ^= 0xFF

    def replace():
        victim.write_bytes(bytes(other))
        os.utime(victim, (stat.st_atime, stat.st_mtime + 60))

    try:
        http_range.reset()
        http_range.replace_after = (1, replace)
        out = run("qem", "validate", f"{http_range.url}/victim.qem", check=False)
        assert out.returncode == 2
        err = out.stdout.decode() + out.stderr.decode()
        assert "the object changed since it was opened" in err, err
    finally:
        http_range.reset()
        victim.unlink()


def walk(container, flags=(), env=None, path=""):
    """Every file of a container's tree, through `qem ls`."""
    names = run("qem", "ls", container, *([path] if path else []), *flags, env=env).stdout.decode().split()
    files = []
    for name in names:
        full = f"{path}/{name}".strip("/")
        if name.endswith("/"):
            files += walk(container, flags, env, full.rstrip("/"))
        else:
            files.append(full)
    return files


@pytest.mark.parametrize("name", ["scan-u16.qem", "derived-scaled.qem", "embeddings.semq"])
def test_the_tree_of_a_url_equals_the_local_tree(files, http_range, s3, name):
    """`qem ls` and `qem cat` of a URL: the same tree, file for file and
    byte for byte, as of the local copy, but the stored file itself
    (`raw.qem`, `raw.semq`), which is not served from a remote object."""
    local = walk(files / name)
    raw = [f for f in local if f.startswith("raw.")]
    assert len(raw) == 1
    for url, flags, env in [
        (f"{http_range.url}/{name}", (), None),
        (f"s3://lab/acq/{name}", ("--endpoint-url", s3), s3_env()),
    ]:
        remote = walk(url, flags, env)
        assert remote == [f for f in local if f not in raw]
        # Frames, the whole array, virtual images, Zarr chunks, vectors.
        picked = [
            f
            for f in remote
            if f.endswith((".json", ".npy", "sha256", "state_id", "content_digest", "ids.txt"))
            or "/c/" in f
            or f.startswith("frames/0/")
        ]
        assert len(picked) > 5
        for f in picked:
            mine = run("qem", "cat", url, f, *flags, env=env).stdout
            theirs = run("qem", "cat", files / name, f).stdout
            assert mine == theirs, f


def test_convert_reads_a_qem_url_and_refuses_what_it_cannot_do(files, http_range, tmp_path):
    url = f"{http_range.url}/scan-u16.qem"
    run("qem", "convert", url, tmp_path / "remote.npy")
    run("qem", "convert", files / "scan-u16.qem", tmp_path / "local.npy")
    assert (tmp_path / "remote.npy").read_bytes() == (tmp_path / "local.npy").read_bytes()
    np.save(files / "frames.npy", np.zeros((2, 2, 4, 4), np.uint16))
    try:
        out = run("qem", "convert", f"{http_range.url}/frames.npy", tmp_path / "x.qem", check=False)
        assert out.returncode == 2 and "download other formats first" in out.stderr.decode()
        assert not (tmp_path / "x.qem").exists()
    finally:
        (files / "frames.npy").unlink()
    out = run("qem", "convert", files / "scan-u16.qem", "s3://lab/out.qem", check=False)
    assert out.returncode == 2 and "not supported yet" in out.stderr.decode()


@pytest.fixture
def mounts(request):
    # Checked before the shared `mount` fixture, which skips: under CI a
    # remote mount test that cannot mount fails.
    if not can_mount() and os.environ.get("CI"):
        pytest.fail("CI runs as root with /dev/fuse: the remote mount tests must run")
    return request.getfixturevalue("mount")


def tree_files(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", ["scan-u16.qem", "embeddings.semq"])
@pytest.mark.parametrize("store", ["http", "s3"])
def test_a_mounted_url_serves_what_the_local_mount_serves(files, http_range, s3, mounts, store, name, monkeypatch):
    if store == "http":
        remote = mounts(f"{http_range.url}/{name}")
    else:
        # The daemon takes its credentials from the environment.
        for key, value in s3_env().items():
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, value)
        remote = mounts(f"s3://lab/acq/{name}", "--endpoint-url", s3)
    local = mounts(files / name)
    local_files = tree_files(local)
    remote_files = tree_files(remote)
    assert remote_files == [f for f in local_files if not f.startswith("raw.")]
    picked = [
        f
        for f in remote_files
        if not f.startswith("frames/") or f.startswith(("frames/0/", "frames/23/"))
    ]
    assert len(picked) > (100 if name.endswith(".qem") else 5)
    for f in picked:
        assert (remote / f).read_bytes() == (local / f).read_bytes(), f
    array = "data.npy" if name.endswith(".qem") else "vectors.npy"
    a = np.load(remote / array, mmap_mode="r")
    assert np.array_equal(a, np.load(local / array))


def test_a_mounted_url_survives_its_server_failing(files, http_range, mounts):
    mnt = mounts(f"{http_range.url}/large.qem")
    assert "data.npy" in os.listdir(mnt)  # opened: the header is here
    http_range.reset()
    http_range.fail_next = 10_000
    try:
        with pytest.raises(OSError) as failed:
            (mnt / "data.npy").read_bytes()
        assert failed.value.errno == 5  # EIO
        assert "info.json" in os.listdir(mnt)  # the mount lives on
    finally:
        http_range.reset()
    assert (mnt / "data.npy").read_bytes() == run("qem", "cat", files / "large.qem", "data.npy").stdout


def test_mounting_a_missing_url_fails_at_once(http_range, s3, tmp_path):
    for url, flags, reason in [
        (f"{http_range.url}/missing.qem", [], "no such object (HTTP 404)"),
        ("s3://nobucket/scan.qem", ["--endpoint-url", s3, "--no-sign-request"], "no such bucket"),
        (f"{http_range.url}/notes.txt", [], "not a .qem or .semq object"),
    ]:
        out = run("qemfs", "mount", url, tmp_path, *flags, check=False)
        assert out.returncode == 2, url
        assert reason in out.stderr.decode(), out.stderr.decode()


def test_readers_of_a_mounted_url_at_once_fetch_each_byte_once(files, http_range, mounts):
    """Eight readers of a cold mounted URL at once, each its own frames and
    the whole array: every answer right, and the object fetched once."""
    from concurrent.futures import ThreadPoolExecutor

    mnt = mounts(f"{http_range.url}/large.qem")
    local = np.load(io_bytes(run("qem", "cat", files / "large.qem", "data.npy").stdout))
    http_range.reset()

    def read(k):
        if k == 0:
            return np.array_equal(np.load(mnt / "data.npy"), local)
        row, col = divmod(k * 97, 32)
        frame = np.load(mnt / "frames" / str(row % 32) / f"{col}.npy")
        return np.array_equal(frame, local[row % 32, col])

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, range(8)))
    fetched = http_range.total("large.qem")
    size = (files / "large.qem").stat().st_size
    assert fetched <= 1.1 * size, f"{fetched} bytes fetched for a {size}-byte object"


def io_bytes(data):
    import io

    return io.BytesIO(data)


def s3_client(endpoint):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )


def use_s3_env(monkeypatch):
    """The daemon takes its credentials from the environment."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    for key, value in s3_env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)


# Keys of the prefix test, and the local folder tree they mirror.
PREFIX_LAYOUT = {
    "2026/run1/scan-u16.qem": "scan-u16.qem",
    "2026/run1/notes.txt": None,
    "2026/run2/derived.qem": "derived-scaled.qem",
    "2026/embeddings.semq": "embeddings.semq",
    "top.qem": "scan-u16.qem",
}


def test_a_mounted_prefix_mirrors_its_keys_as_folders(files, s3, mounts, tmp_path, monkeypatch):
    client = s3_client(s3)
    client.create_bucket(Bucket="tree")
    local = tmp_path / "local"
    for key, name in PREFIX_LAYOUT.items():
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        if name is None:
            (local / key).write_bytes(b"beam current 1.2 nA\n" * 100)
        else:
            shutil.copy(files / name, local / key)
        client.upload_file(str(local / key), "tree", key)
    # A console's "folder": a zero-byte key ending in `/`, not an entry.
    client.put_object(Bucket="tree", Key="2026/run1/", Body=b"")
    use_s3_env(monkeypatch)
    local_mnt = mounts(local)
    bucket_mnt = mounts("s3://tree", "--endpoint-url", s3)
    prefix_mnt = mounts("s3://tree/2026/", "--endpoint-url", s3)

    assert sorted(os.listdir(bucket_mnt)) == ["2026", "top.qem"]
    assert sorted(os.listdir(bucket_mnt / "2026" / "run1")) == ["notes.txt", "scan-u16.qem"]
    for remote, base in [(bucket_mnt, local_mnt), (prefix_mnt, local_mnt / "2026")]:
        want = [f for f in tree_files(base) if "/raw." not in f and not f.startswith("raw.")]
        assert tree_files(remote) == want
        picked = [f for f in want if "/frames/" not in f or "/frames/0/" in f]
        assert len(picked) > 100
        for f in picked:
            assert (remote / f).read_bytes() == (base / f).read_bytes(), f
        for f in want:
            assert (remote / f).stat().st_size == (base / f).stat().st_size, f
    note = (bucket_mnt / "2026" / "run1" / "notes.txt").stat()
    assert note.st_mode & 0o777 == 0o400 and not (bucket_mnt / "2026").is_file()


def test_an_object_replaced_under_a_mounted_prefix(files, s3, mounts, monkeypatch):
    """A handle opened on the old object never reads bytes of two
    versions: it reads the old one whole (its checked blocks were staged
    before the swap), or, once the kernel asks for the file's attributes
    again and the mount sees the new object, its reads fail (ESTALE, as for
    a local file replaced; EIO for a range not yet fetched, as
    test_an_object_replaced_while_read_is_refused shows). A lookup after
    the listing's second sees the new object."""
    client = s3_client(s3)
    client.create_bucket(Bucket="swap")
    client.upload_file(str(files / "large.qem"), "swap", "run/x.qem")
    use_s3_env(monkeypatch)
    mnt = mounts("s3://swap/run", "--endpoint-url", s3)
    before = json.loads((mnt / "x.qem" / "info.json").read_bytes())
    old = run("qem", "cat", files / "large.qem", "data.npy").stdout
    with open(mnt / "x.qem" / "data.npy", "rb") as held:
        first = held.read(4096)
        time.sleep(1.1)  # a Last-Modified of its own second
        client.upload_file(str(files / "scan-u16.qem"), "swap", "run/x.qem")
        try:
            assert first + held.read() == old
        except OSError as e:
            assert e.errno in (errno.ESTALE, errno.EIO), e
    time.sleep(1.5)  # the listing's and the kernel's second
    after = json.loads((mnt / "x.qem" / "info.json").read_bytes())
    assert after != before
    local = json.loads(run("qem", "cat", files / "scan-u16.qem", "info.json").stdout)
    assert after == local
    assert np.array_equal(
        np.load(mnt / "x.qem" / "data.npy"),
        np.load(io_bytes(run("qem", "cat", files / "scan-u16.qem", "data.npy").stdout)),
    )


def test_mounting_a_prefix_checks_the_bucket(s3, tmp_path, monkeypatch):
    use_s3_env(monkeypatch)
    out = run("qemfs", "mount", "s3://nobucket/2026/", tmp_path, "--endpoint-url", s3, check=False)
    assert out.returncode == 2
    assert "no such bucket 'nobucket'" in out.stderr.decode(), out.stderr.decode()
