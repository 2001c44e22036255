//! The `qem` command line: one clap definition that the binary parses with
//! and from which the man pages and shell completions are generated.

use clap::{Args, Parser, Subcommand, ValueEnum};
use qemfs_args::completions::CompletionsArgs;
use qemfs_args::detector::DetectorArgs;
use qemfs_args::gpu::GpuArgs;
use std::path::PathBuf;

/// The longest chunk any codec takes; the writer checks the codec's own bound.
const MAX_CHUNK_SCANS: i64 = qemfs::qem::write::MAX_COUNT_CHUNK_SCANS as i64;

const EXAMPLES: &str = "\
Examples:
  qem show scan.qem
  qem validate *.qem                       # full check: decode everything
  qem hash a.qem b.qem                     # equal hashes = same measurements
  qem diff a.qem b.qem --json
  qem convert scan.npy scan.qem --metadata calib.json
  qem convert scan.qem scan.npy
  qem convert scan.qem frames.tiff
  qem convert scan.qem scan.zarr
  qem convert scan.zarr scan.qem
  qem ls scan.qem virtual
  qem cat scan.qem virtual/sum.npy > sum.npy
  qem show s3://lab/2026/scan.qem             # fetches the header alone
  qem validate --endpoint-url http://127.0.0.1:9000 s3://lab/scan.qem
  qem hash https://data.example.org/scan.qem

Remote sources: a .qem or .semq input may be an s3://BUCKET/KEY or
http(s):// URL; only the ranges an answer needs are fetched (the header,
then whole 64 MiB checksum blocks), each pinned to the version opened. S3
credentials and endpoint come the AWS way (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL_S3
or AWS_ENDPOINT_URL, AWS_PROFILE and ~/.aws/{credentials,config}), under
--endpoint-url, --region and --no-sign-request.

Memory: whatever size a file declares, validate, hash, cat and convert hold
at most about 256 MiB of decoded frames per file, plus 20 bytes per detector
pixel: a block that decodes to more than 64 MiB is decoded in windows.
Files given together are worked on in parallel, one per core. A run that
cannot get the memory it needs (ulimit -v, a container's or a scheduler's
limit) names the file, removes its unfinished outputs and exits 2.

Outputs appear whole or not at all. A run stopped by Ctrl-C, kill or a
closed terminal removes its unfinished outputs, then ends with that
signal's status (130 for Ctrl-C).

Exit status: 0 ok / same, 1 files differ, 2 error or invalid input.";

#[derive(Debug, Parser)]
#[command(
    name = "qem",
    version,
    about = "Inspect, check, compare and convert .qem 4D-STEM acquisitions",
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub remote: qemfs_args::remote::RemoteArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print codec, dtypes, shape, chunks, sizes, compression and calibration
    #[command(after_help = "Examples:
  qem show scan.qem
  qem show --json scan.qem              # header and summary, for jq or Python
  qem show s3://lab/scan.qem            # fetches the header alone")]
    Show(ShowArgs),
    /// Check files: decode everything, verify checksums and the spatial index
    #[command(after_help = "Examples:
  qem validate *.qem                    # exit 2 names the first bad file and why
  qem validate --quick big.qem          # structure and body checksums, no decoding
  qem validate --endpoint-url http://127.0.0.1:9000 s3://lab/scan.qem")]
    Validate(ValidateArgs),
    /// SHA-256 of the decoded array (or of the file bytes), like sha256sum
    #[command(after_help = "Examples:
  qem hash a.qem b.qem                  # equal hashes = same measurements
  qem hash --file a.qem                 # the bytes, as sha256sum prints them
  qem hash https://data.example.org/scan.qem")]
    Hash(HashArgs),
    /// Compare two acquisitions: shape, dtype, codec, metadata, measurements
    #[command(after_help = "Examples:
  qem diff a.qem b.qem                  # exit 0 same, 1 different
  qem diff --json a.qem b.qem")]
    Diff(DiffArgs),
    /// Convert detector data (.npy, TIFF, EMPAD, Merlin MIB, DECTRIS HDF5, EMD, Zarr, raw) to .qem, and .qem to .npy, .tiff, .zarr, .emd or .raw
    #[command(after_help = "Examples:
  qem convert scan.npy scan.qem --metadata calib.json
  qem convert scan.npy scan.qem --voltage-kv 300 --scan-step 0.5nm --detector-sampling 0.8mrad
  qem convert scan_master.h5 scan.qem --scan 256,256              # DECTRIS ARINA/EIGER
  qem convert scan_master.h5 scan.qem --scan 256,256 --dectris-markers mask
  qem convert default.mib scan.qem --scan 128,128                 # Merlin: frames in file row order (hyperspy flips them)
  qem convert acquisition.xml scan.qem                            # EMPAD (.xml + .raw)
  qem convert stack.tif scan.qem --scan 64,64
  qem convert data.h5:/experiment/datacube scan.qem
  qem convert frames.raw scan.qem --shape 64,64,128,128 --dtype uint16
  qem convert scan.qem scan.npy
  qem convert scan.qem scan.tiff --masked                         # Fiji hyperstack
  qem convert scan.qem scan.zarr && qem convert scan.zarr back.qem
  qem convert scan.qem scan.zarr --zarr-shard-mib 0                # one file per chunk, no shards
  qem convert scan.qem scan.emd --hdf5-compression gzip          # py4DSTEM DataCube, hyperspy
  qem convert scan.emd back.qem                                   # EMD: no dataset path needed
  qem convert scan.qem scan.raw                                   # prints its --shape and --dtype")]
    Convert(ConvertArgs),
    /// List the virtual tree of a .qem or .semq file, as the mount shows it
    #[command(after_help = "Examples:
  qem ls scan.qem
  qem ls scan.qem virtual")]
    Ls(LsArgs),
    /// Write one file of the virtual tree to stdout, byte for byte as mounted
    #[command(after_help = "Examples:
  qem cat scan.qem virtual/bf.npy > bf.npy
  qem cat scan.qem frames/3/17.npy > frame.npy
  qem cat scan.qem info.json
  qem cat s3://lab/scan.qem virtual/bf.npy > bf.npy")]
    Cat(CatArgs),
    /// Print a shell completion script
    #[command(after_help = "Examples:
  qem completions bash > /etc/bash_completion.d/qem
  qem completions zsh > ~/.zfunc/_qem")]
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The .qem file
    pub file: PathBuf,
    /// Print the full header and the computed summary as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Files to check (in parallel)
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Only the envelope, header, metadata, layout and body checksums
    #[arg(long)]
    pub quick: bool,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// Files to hash
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Hash the file bytes instead of the decoded array
    #[arg(long)]
    pub file: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    pub a: PathBuf,
    pub b: PathBuf,
    /// Print the differences as one JSON object
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RawDtype {
    Uint8,
    Uint16,
    Uint32,
    Int16,
    Int32,
    Float32,
    Float64,
}

fn parse_scan(text: &str) -> Result<[u64; 2], String> {
    let dims: Vec<u64> = text
        .split(',')
        .map(|d| d.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{text:?}: expected ROWS,COLS"))?;
    match dims[..] {
        [r, c] if r > 0 && c > 0 => Ok([r, c]),
        _ => Err(format!("{text:?}: expected two positive numbers ROWS,COLS")),
    }
}

fn parse_shape(text: &str) -> Result<[u32; 4], String> {
    let dims: Vec<u32> = text
        .split(',')
        .map(|d| d.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{text:?} is not four comma-separated sizes"))?;
    dims.try_into()
        .map_err(|_| format!("{text:?} is not four comma-separated sizes"))
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// .npy, .qem, TIFF stack, EMPAD .xml (+ .raw), Merlin .mib (+ .hdr), DECTRIS
    /// HDF5 master file, EMD (py4DSTEM, NCEM), FILE.h5:/dataset, a Zarr store
    /// (folder) or raw binary (with --shape and --dtype); recognised by content
    pub input: PathBuf,
    /// .qem, .npy, .tiff, .zarr (a Zarr v3 store), .emd / .h5 / .hdf5 (EMD 1.0,
    /// py4DSTEM's DataCube layout) or .raw (headerless; its shape and dtype are printed)
    pub output: PathBuf,
    /// JSON merged into the scientific metadata (calibration, voltage, ...)
    #[arg(long, value_name = "JSON")]
    pub metadata: Option<PathBuf>,
    /// Raw input: scan_rows,scan_columns,detector_rows,detector_columns
    #[arg(long, value_parser = parse_shape, value_name = "R,C,DR,DC")]
    pub shape: Option<[u32; 4]>,
    /// Raw input: element type (little-endian)
    #[arg(long, value_enum)]
    pub dtype: Option<RawDtype>,
    /// Scan shape of inputs that lack one (3-D arrays, stacks)
    #[arg(long, value_parser = parse_scan, value_name = "ROWS,COLS")]
    pub scan: Option<[u64; 2]>,
    /// Store float64 values that do not fit float32 exactly as the nearest
    /// float32 (recorded in processing) instead of refusing them
    #[arg(long)]
    pub allow_float_rounding: bool,
    /// Refuse --metadata keys outside the scientific metadata schema
    /// (by default they are kept, with a warning naming each)
    #[arg(long)]
    pub strict_metadata: bool,
    /// Accelerating voltage in kV
    #[arg(long, value_name = "KV")]
    pub voltage_kv: Option<f64>,
    /// Scan step with its unit (A, nm, pm, um), one value or ROW,COL: 0.5nm, 1.2,1.3A
    #[arg(long, value_parser = qemfs::convert::metadata::parse_scan_step, value_name = "STEP")]
    pub scan_step: Option<[f64; 2]>,
    /// Detector pixel size with its unit (mrad, urad, 1/A, 1/nm): 0.8mrad, 0.01,0.01 1/A
    #[arg(long, value_parser = qemfs::convert::metadata::parse_detector_sampling, value_name = "SAMPLING")]
    pub detector_sampling: Option<([f64; 2], qemfs::qem::write::DetectorUnit)>,
    /// Scans per chunk of the written .qem (1 to 1024; float32 files hold
    /// at most 512, fewer for detectors over 16384 pixels). A chunk's frames
    /// are held in memory while it is written: at most 1 GiB of them
    /// (default: 512 scans, fewer where they exceed 256 MiB)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CHUNK_SCANS))]
    pub chunk_scans: Option<u32>,
    /// Compression of a written .zarr store's chunks
    #[arg(long, value_enum, default_value = "blosc-zstd", value_name = "CODEC")]
    pub zarr_compression: ZarrCompression,
    /// Decoded MiB per shard file of a written .zarr store (v3
    /// sharding_indexed: inner chunks of one block each, compressed as
    /// --zarr-compression says, grouped in whole scan rows); 0 writes one
    /// file per chunk. Writing holds about two shards per core in memory,
    /// hence the bound
    #[arg(long, value_name = "MIB", default_value_t = qemfs::zarr::shard::DEFAULT_SHARD_MIB,
          value_parser = clap::value_parser!(u64).range(0..=4096))]
    pub zarr_shard_mib: u64,
    /// Compression of a written .emd / .h5 file's chunks (standard HDF5
    /// filters every reader has)
    #[arg(long, value_enum, default_value = "none", value_name = "CODEC")]
    pub hdf5_compression: Hdf5Compression,
    /// Exports (.npy, .tiff, .emd, .raw): write the pixels the validity mask
    /// marks invalid as zero (counts files; data.npy and plain exports keep them)
    #[arg(long)]
    pub masked: bool,
    /// DECTRIS input: an overflow/defect marker (2^bit_depth - 1) in a pixel
    /// the pixel_mask does not flag refuses the file, or (mask) makes every
    /// pixel holding one invalid, the markers stored as 0, after a first pass
    #[arg(long, value_enum, default_value = "refuse", value_name = "POLICY")]
    pub dectris_markers: DectrisMarkers,
    /// Replace OUTPUT if it exists
    #[arg(long)]
    pub force: bool,
}

/// Chunk compression of `qem convert X.qem X.emd` (or .h5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Hdf5Compression {
    /// uncompressed chunks
    None,
    /// byte shuffle, then deflate (gzip) level 4
    Gzip,
}

/// What `qem convert` does with DECTRIS overflow/defect markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DectrisMarkers {
    /// exit 2, naming the first frame and pixel that holds one
    Refuse,
    /// mark the pixels that hold one invalid and store 0 there
    Mask,
}

/// Chunk compression of `qem convert X.qem X.zarr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ZarrCompression {
    /// blosc: byte shuffle, then zstd level 3
    BloscZstd,
    /// blosc: byte shuffle, then LZ4 (fastest to read)
    BloscLz4,
    /// zstd level 3
    Zstd,
    /// uncompressed
    None,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// The .qem or .semq file
    pub file: PathBuf,
    /// A folder inside its virtual tree (default: the top)
    pub path: Option<String>,
    /// Also print sizes (bytes)
    #[arg(short, long)]
    pub long: bool,
    #[command(flatten)]
    pub detectors: DetectorArgs,
    #[command(flatten)]
    pub gpu: GpuArgs,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    /// The .qem or .semq file
    pub file: PathBuf,
    /// A file inside its virtual tree, e.g. data.npy or frames/0/0.npy
    pub path: String,
    #[command(flatten)]
    pub detectors: DetectorArgs,
    #[command(flatten)]
    pub gpu: GpuArgs,
}
