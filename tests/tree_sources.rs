//! What of the source folder the tree shows: symbolic links inside and
//! outside it, loops, the mount point, names that are not UTF-8, single
//! files as roots, permission bits, and frame names as users type them.
//! The tree is the mount's core, so these hold for `qemfs mount` too
//! (fs/tests/lifecycle.rs checks the same through a real mount).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use qemfs::tree::content::read_all;
use qemfs::tree::{Node, Tree, TreeOptions};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/conformance/qem")
        .join(name)
}

/// A tree whose log lines are kept.
fn tree(root: &Path, options: TreeOptions) -> (Tree, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&lines);
    let mut options = options;
    options.log = Arc::new(move |l: &str| kept.lock().unwrap().push(l.to_string()));
    (Tree::new(root, &options), lines)
}

fn names(tree: &Tree, path: &str) -> Vec<String> {
    let node = tree.resolve(path).unwrap();
    tree.list(&node)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

fn read(tree: &Tree, path: &str) -> Vec<u8> {
    match tree.resolve(path).unwrap_or_else(|e| panic!("{path}: {e}")) {
        Node::File(f, _) => read_all(f.as_ref()).unwrap(),
        _ => panic!("{path}: not a file"),
    }
}

#[test]
fn links_inside_are_shown_links_out_and_loops_are_not() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(tmp.path().join("secret.txt"), b"outside\n").unwrap();
    fs::write(src.join("a/inside.txt"), b"inside\n").unwrap();
    fs::copy(fixture("u8-two-block-chunks.qem"), src.join("a/scan.qem")).unwrap();
    symlink("a/inside.txt", src.join("good.txt")).unwrap();
    symlink("a/scan.qem", src.join("alias.qem")).unwrap();
    symlink("a", src.join("dir-link")).unwrap();
    symlink("../secret.txt", src.join("escape.txt")).unwrap();
    symlink("/etc/passwd", src.join("passwd")).unwrap();
    symlink("..", src.join("up")).unwrap();
    symlink("..", src.join("a/back")).unwrap(); // a/back -> src: a loop
    symlink("self", src.join("self")).unwrap();
    symlink("missing", src.join("dangling")).unwrap();

    let (t, log) = tree(&src, TreeOptions::default());
    let listed = names(&t, "");
    assert_eq!(
        listed,
        ["a", "alias.qem", "dir-link", "good.txt"],
        "{listed:?}"
    );
    assert_eq!(
        names(&t, "a"),
        ["inside.txt", "scan.qem"],
        "the loop is left out"
    );
    assert_eq!(read(&t, "good.txt"), b"inside\n");
    assert_eq!(read(&t, "dir-link/inside.txt"), b"inside\n");
    assert_eq!(
        read(&t, "alias.qem/info.json"),
        read(&t, "a/scan.qem/info.json"),
        "a linked container is the container"
    );
    for refused in [
        "escape.txt",
        "passwd",
        "up",
        "a/back",
        "self",
        "dangling",
        "up/src",
    ] {
        assert!(t.resolve(refused).is_err(), "{refused} must not resolve");
    }
    let log = log.lock().unwrap().join("\n");
    for (what, why) in [
        ("escape.txt", "outside the source folder"),
        ("passwd", "outside the source folder"),
        ("back", "a loop"),
        ("self", "too many levels"),
    ] {
        assert!(log.contains(what) && log.contains(why), "{what}: {log}");
    }

    // Asked to, links out are followed; loops and the mount point still not.
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    fs::write(mnt.join("under-the-mount.txt"), b"hidden\n").unwrap();
    symlink(&mnt, src.join("into-mount")).unwrap();
    let mut options = TreeOptions::default();
    options.follow_symlinks = true;
    options.mountpoint = Some(fs::canonicalize(&mnt).unwrap());
    let (t, log) = tree(&src, options);
    assert_eq!(read(&t, "escape.txt"), b"outside\n");
    assert!(t.resolve("up").is_err(), "up holds the source: a loop");
    assert!(t.resolve("a/back").is_err());
    assert!(t.resolve("into-mount").is_err());
    assert!(t.resolve("into-mount/under-the-mount.txt").is_err());
    assert!(!names(&t, "").contains(&"into-mount".to_string()));
    assert!(log
        .lock()
        .unwrap()
        .join("\n")
        .contains("into the mount point"));
}

#[test]
fn names_that_are_not_utf8_are_left_out_not_aliased() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join(OsStr::from_bytes(b"caf\xe9.txt"));
    fs::write(&bad, b"latin-1 name\n").unwrap();
    // A file really named with U+FFFD, what a lossy conversion would make.
    fs::write(tmp.path().join("caf\u{FFFD}.txt"), b"replacement char\n").unwrap();
    let (t, log) = tree(tmp.path(), TreeOptions::default());
    assert_eq!(names(&t, ""), ["caf\u{FFFD}.txt"]);
    assert_eq!(read(&t, "caf\u{FFFD}.txt"), b"replacement char\n");
    assert!(log.lock().unwrap().join("\n").contains("not UTF-8"));
}

#[test]
fn a_single_file_is_a_root_and_fifos_are_not_mirrored() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("scan.qem");
    fs::copy(fixture("u8-two-block-chunks.qem"), &file).unwrap();
    let (t, _) = tree(&file, TreeOptions::default());
    let listed = names(&t, "");
    assert!(listed.contains(&"data.npy".to_string()), "{listed:?}");
    let folder = Tree::new(tmp.path(), &TreeOptions::default());
    assert_eq!(read(&t, "data.npy"), read(&folder, "scan.qem/data.npy"));

    let fifo = tmp.path().join("pipe.txt");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    assert_eq!(names(&folder, ""), ["scan.qem"]);
    assert!(folder.resolve("pipe.txt").is_err());
}

#[test]
fn permission_bits_and_owners_are_the_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let scan = tmp.path().join("private.qem");
    fs::copy(fixture("u8-two-block-chunks.qem"), &scan).unwrap();
    fs::set_permissions(&scan, fs::Permissions::from_mode(0o640)).unwrap();
    let script = tmp.path().join("run.sh");
    fs::write(&script, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o750)).unwrap();
    let t = Tree::new(tmp.path(), &TreeOptions::default());
    let attr = |p: &str| t.attr(&t.resolve(p).unwrap());
    assert_eq!(
        attr("private.qem").perm,
        0o550,
        "r-- bits give r-x on the folder"
    );
    assert_eq!(attr("private.qem/data.npy").perm, 0o440);
    assert_eq!(
        attr("run.sh").perm,
        0o550,
        "passed through: keeps x, never w"
    );
    let meta = fs::metadata(&scan).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(attr("private.qem/data.npy").uid, meta.uid());
    assert_eq!(attr("private.qem/data.npy").gid, meta.gid());
}

#[test]
fn frames_are_found_by_padded_and_unpadded_indices() {
    use qemfs::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    // 12 x 103 scans: rows are listed as 00..11, columns as 000..102.
    let shape = [12u64, 103, 2, 3];
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let values: Vec<u16> = (0..12 * 103 * 6).map(|i| (i % 7) as u16).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tmp = tempfile::tempdir().unwrap();
    fs::write(
        tmp.path().join("s.qem"),
        encode_to_vec(spec, &bytes).unwrap(),
    )
    .unwrap();
    let t = Tree::new(tmp.path(), &TreeOptions::default());
    let rows = names(&t, "s.qem/frames");
    assert_eq!((rows[3].as_str(), rows.len()), ("03", 12));
    assert!(names(&t, "s.qem/frames/03").contains(&"017.npy".to_string()));
    let padded = read(&t, "s.qem/frames/03/017.npy");
    for typed in [
        "s.qem/frames/3/17.npy",
        "s.qem/frames/03/17.npy",
        "s.qem/frames/3/017.npy",
    ] {
        assert_eq!(read(&t, typed), padded, "{typed}");
    }
    assert_eq!(
        read(&t, "s.qem/frames/0/0.tiff"),
        read(&t, "s.qem/frames/00/000.tiff")
    );
    // Half-padded names are neither listed nor typed numbers: not aliases.
    for refused in [
        "s.qem/frames/03/0017.npy",
        "s.qem/frames/03/017x.npy",
        "s.qem/frames/12",
        "s.qem/frames/3/03.npy",
    ] {
        assert!(t.resolve(refused).is_err(), "{refused}");
    }
}

#[test]
fn only_the_most_recently_used_containers_stay_open() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        fs::copy(
            fixture("u8-two-block-chunks.qem"),
            tmp.path().join(format!("{name}.qem")),
        )
        .unwrap();
    }
    let mut options = TreeOptions::default();
    options.open_containers = 2;
    let t = Tree::new(tmp.path(), &options);
    let whole = read(&t, "a.qem/data.npy");
    let per_container = t.cache().stats().entries;
    assert!(per_container > 0);
    read(&t, "b.qem/data.npy");
    assert_eq!(t.cache().stats().entries, 2 * per_container);
    // Opening a third closes the least recently used (a) and drops its
    // decoded blocks with it.
    read(&t, "c.qem/data.npy");
    assert_eq!(t.cache().stats().entries, 2 * per_container);
    // A closed container opens again on its next lookup, with equal bytes.
    assert_eq!(read(&t, "a.qem/data.npy"), whole);
    assert_eq!(t.cache().stats().entries, 2 * per_container);
}
