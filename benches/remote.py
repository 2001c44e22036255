#!/usr/bin/env python3
"""Remote sources against local files, on one acquisition, in a few minutes.

    .venv/bin/python benches/remote.py [FILE.qem] [--latency-ms 20]

Without FILE, a 64 x 64 x 128 x 128 low-dose uint16 acquisition (128 MiB
dense) is written with `qem convert`. Everything runs on 127.0.0.1: moto's
S3 server, a counting HTTP server with Range (RangeHTTPServer's handler)
and a delay line (a TCP proxy that holds every chunk for half the round
trip in each direction, without limiting the rate).

Printed, each from a fresh mount (the source in the page cache):
1. the S3 server's raw GET rate for the object (boto3, one stream), and
   `qem hash --file` of the URL (ranged, concurrent);
2. `data.npy` read sequentially (4 MiB reads) through a local mount, an S3
   mount, and the S3 mount behind the delay line; the ratio to
   min(raw GET, local mount);
3. the first frame of a cold mount behind the delay line;
4. bytes fetched, as a fraction of the file, for `qem show`,
   `virtual/sum.npy` and `virtual/bf.npy`, with the time of `bf.npy` from a
   URL against downloading the file and computing it locally.

Needs root and /dev/fuse for the mounts.
"""

import argparse
import asyncio
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "target" / "release"
LOOPBACK = "127.0.0.1"
sys.path.insert(0, str(REPO / "tests" / "clients"))


def free_port():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_port(port):
    for _ in range(300):
        try:
            socket.create_connection((LOOPBACK, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def qem(*args, **kw):
    return subprocess.run([str(BIN / "qem"), *map(str, args)], check=True, capture_output=True, **kw)


def make_file(work: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.poisson(0.5, size=(64, 64, 128, 128)).astype(np.uint16)
    a[:, :, 56:72, 56:72] += rng.poisson(40, size=(64, 64, 16, 16)).astype(np.uint16)
    np.save(work / "a.npy", a)
    out = work / "bench.qem"
    qem("convert", work / "a.npy", out)
    (work / "a.npy").unlink()
    return out


class DelayLine:
    """A TCP proxy on 127.0.0.1 that delivers every chunk `half` seconds
    after it arrived, in both directions: a round trip of 2 * half."""

    def __init__(self, target_port, half):
        self.target, self.half = target_port, half
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        wait_port(self.port)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(asyncio.start_server(self._serve, LOOPBACK, self.port))
        self.loop.run_forever()

    async def _pipe(self, reader, writer):
        queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.create_task(deliver())
        while data := await reader.read(1 << 16):
            await queue.put((time.monotonic() + self.half, data))
        await queue.put((0, None))
        await task

    async def _serve(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)


def mounted(src, *flags, env=None):
    mnt = Path(tempfile.mkdtemp(prefix="qemfs-bench-"))
    subprocess.run([str(BIN / "qemfs"), "mount", str(src), str(mnt), *flags], check=True, env=env)
    return mnt


def unmount(mnt):
    subprocess.run([str(BIN / "qemfs"), "unmount", str(mnt)], check=False)
    mnt.rmdir()


def read_rate(path, size):
    start = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass
    return size / (time.monotonic() - start) / 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file", nargs="?", type=Path)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    import boto3
    from RangeHTTPServer import RangeRequestHandler

    work = Path(tempfile.mkdtemp(prefix="qemfs-remote-bench-"))
    file = args.file or make_file(work)
    size = file.stat().st_size
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    port = free_port()
    moto = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    endpoint = f"http://{LOOPBACK}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1")
    client.create_bucket(Bucket="bench")
    client.upload_file(str(file), "bench", "bench.qem")
    url = "s3://bench/bench.qem"
    print(f"file: {file} ({size / 1e6:.1f} MB); load average {os.getloadavg()[0]:.2f}")
    try:
        start = time.monotonic()
        body = client.get_object(Bucket="bench", Key="bench.qem")["Body"]
        while body.read(4 << 20):
            pass
        raw = size / (time.monotonic() - start) / 1e6
        print(f"raw GET (boto3, one stream):        {raw:8.1f} MB/s")
        start = time.monotonic()
        qem("hash", "--file", url, "--endpoint-url", endpoint, env=env)
        print(f"qem hash --file URL (ranged):       {size / (time.monotonic() - start) / 1e6:8.1f} MB/s")

        npy_size = None
        rates = {}
        for label, src, flags in [
            ("local mount", file, []),
            ("S3 mount", url, ["--endpoint-url", endpoint]),
        ]:
            mnt = mounted(src, *flags, env=env)
            npy = mnt / "data.npy"
            npy_size = npy.stat().st_size
            rates[label] = read_rate(npy, npy_size)
            unmount(mnt)
            print(f"data.npy, {label:<22}   {rates[label]:8.1f} MB/s (decoded)")
        line = DelayLine(port, args.latency_ms / 2000)
        delayed = f"http://{LOOPBACK}:{line.port}"
        mnt = mounted(url, "--endpoint-url", delayed, env=env)
        start = time.monotonic()
        (mnt / "frames" / "0" / "0.npy").read_bytes()
        first = time.monotonic() - start
        unmount(mnt)
        mnt = mounted(url, "--endpoint-url", delayed, env=env)
        rates["delayed"] = read_rate(mnt / "data.npy", npy_size)
        unmount(mnt)
        print(f"data.npy, S3 mount, +{args.latency_ms:.0f} ms round trip {rates['delayed']:8.1f} MB/s")
        raw_decoded = raw * npy_size / size
        floor = min(raw_decoded, rates["local mount"])
        print(f"ratio S3 mount / min(raw GET as decoded bytes, local mount): {rates['S3 mount'] / floor:.2f}")
        print(f"ratio with latency / without: {rates['delayed'] / rates['S3 mount']:.2f}")
        print(f"first frame of a cold mount, +{args.latency_ms:.0f} ms: {first * 1e3:.0f} ms")
    finally:
        moto.terminate()

    # Bytes fetched per product, from a counting HTTP server.
    served = {"bytes": 0}
    lock = threading.Lock()
    shutil.copy(file, work / "served.qem")

    class Counting(RangeRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(work), **k)

        def log_message(self, *a):
            pass

        def copyfile(self, source, out):
            class W:
                def write(_, data):
                    with lock:
                        served["bytes"] += len(data)
                    out.write(data)

            super().copyfile(source, W())

    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    http_url = f"http://{LOOPBACK}:{server.server_address[1]}/served.qem"
    for label, cmd in [
        ("qem show", ["show", http_url]),
        ("virtual/sum.npy", ["cat", http_url, "virtual/sum.npy"]),
        ("virtual/bf.npy", ["cat", http_url, "virtual/bf.npy"]),
    ]:
        served["bytes"] = 0
        start = time.monotonic()
        qem(*cmd)
        took = time.monotonic() - start
        print(f"{label:<16} fetched {served['bytes'] / size:6.1%} of the file in {took * 1e3:6.0f} ms")
    start = time.monotonic()
    import urllib.request

    with urllib.request.urlopen(http_url) as r, open(work / "down.qem", "wb") as f:
        shutil.copyfileobj(r, f, 4 << 20)
    qem("cat", work / "down.qem", "virtual/bf.npy")
    print(f"download + local bf.npy:                  {(time.monotonic() - start) * 1e3:6.0f} ms")
    server.shutdown()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
