//! `qem ls` and `qem cat`: the mount's virtual tree without mounting.

use std::io::Write;

use qemfs::tree::{Node, Origin, Tree, TreeOptions};

use crate::exit::{Failure, OK};
use crate::out::Stdout;
use crate::qem_args::{CatArgs, LsArgs};
use qemfs_args::detector::DetectorArgs;
use qemfs_args::gpu::GpuArgs;

/// Resolves `path` inside the container of `file`.
fn resolve(tree: &Tree, file: &std::path::Path, path: &str) -> Result<Node, Failure> {
    let origin = match qemfs::remote::Address::of_path(file) {
        Some(_) => Origin::remote(std::time::SystemTime::now()),
        None => {
            Origin::of(&std::fs::metadata(file).map_err(|e| Failure::file(file, e.to_string()))?)
        }
    };
    let mut node = Node::Dir(tree.open_container(file).map_err(Failure::plain)?, origin);
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        node = tree
            .child(&node, part)
            .map_err(|_| Failure::file(file, format!("{path}: no such file or directory")))?;
    }
    Ok(node)
}

fn tree(detectors: &DetectorArgs, gpu: &GpuArgs) -> Tree {
    // The tree checks for truncated sources; the guard keeps them from
    // ending the process first.
    // One command reads each block once; a small budget suffices, and a
    // sequential read then reuses its evicted block buffers early instead
    // of faulting in fresh pages until the budget is full: `qem cat` of
    // the issue-18 acquisition's data.npy took 70,000 page faults and 0.36
    // CPU-s with 256 MiB, 21,000 and 0.28 CPU-s with 64 MiB.
    let mut options = TreeOptions::default();
    options.cache_bytes = 64 << 20;
    options.detectors = detectors.options();
    options.accelerator = gpu.accelerator_quiet_on_auto();
    Tree::new(".", &options)
}

/// Bytes `qem cat` asks for at a time.
const CAT_PIECE: usize = 4 << 20;

/// Entries listed at a time by `qem ls`.
const LS_PAGE: usize = 4096;

pub fn ls(args: &LsArgs) -> Result<u8, Failure> {
    let tree = tree(&args.detectors, &args.gpu);
    let path = args.path.as_deref().unwrap_or("");
    let node = resolve(&tree, &args.file, path)?;
    let mut out = Stdout::new();
    match &node {
        Node::File(f, _) => {
            if args.long {
                writeln!(out, "{:>14}  {path}", f.size())?;
            } else {
                writeln!(out, "{path}")?;
            }
        }
        _ => {
            // Page by page, as the mount's readdir does: `frames/` of a
            // 16.7 M-row scan is never made whole.
            let mut start = 0;
            loop {
                let page = tree
                    .list_range(&node, start..start + LS_PAGE)
                    .map_err(Failure::plain)?;
                if page.is_empty() {
                    break;
                }
                start += page.len();
                for (name, attr) in page {
                    let slash = if attr.is_dir { "/" } else { "" };
                    if args.long {
                        let size = if attr.is_dir {
                            "-".to_string()
                        } else {
                            attr.size.to_string()
                        };
                        writeln!(out, "{size:>14}  {name}{slash}")?;
                    } else {
                        writeln!(out, "{name}{slash}")?;
                    }
                }
            }
        }
    }
    out.done()?;
    Ok(OK)
}

pub fn cat(args: &CatArgs) -> Result<u8, Failure> {
    let tree = tree(&args.detectors, &args.gpu);
    let Node::File(content, _) = resolve(&tree, &args.file, &args.path)? else {
        return Err(Failure::file(
            &args.file,
            format!("{}: is a directory", args.path),
        ));
    };
    let mut out = Stdout::new();
    let mut buffer = vec![0u8; CAT_PIECE];
    let mut offset = 0u64;
    loop {
        // A piece that lies in one held value (a decoded window, a
        // computed image) is written from there: no copy into `buffer`.
        let held = content
            .held_at(offset, CAT_PIECE)
            .map_err(Failure::plain)?
            .filter(|h| !h.is_empty());
        let n = match &held {
            Some(piece) => {
                out.write_all(piece)?;
                piece.len()
            }
            None => {
                let n = content
                    .read_at(offset, &mut buffer)
                    .map_err(Failure::plain)?;
                out.write_all(&buffer[..n])?;
                n
            }
        };
        if n == 0 {
            break;
        }
        offset += n as u64;
    }
    out.done()?;
    Ok(OK)
}
