//! Zarr: one layout for the mount's `data.zarr` view and for the stores
//! `qem convert` writes, and the reading of any Zarr array into `.qem`.
//!
//! `layout` holds the rules both share: dimension names, the chunk shape
//! that follows the file's blocks, the attributes (calibration, identities)
//! and the coordinate arrays. [`store`] writes a compressed Zarr v3 store
//! from a `.qem` file and reads Zarr v2/v3 arrays back, through `zarrs`;
//! [`shard`] sizes the shards of the stores it writes.

mod identity;
pub(crate) mod layout;
pub mod shard;
pub mod store;
