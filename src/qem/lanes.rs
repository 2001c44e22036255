//! Lane groups: `LANES` rANS streams (§7.1) decoded in lockstep, a few
//! steps per call, their values of one step written as one row of a
//! frame-major block. The state lives in a `Group` between calls, so that
//! a block can be decoded a slab of frames at a time across all its pixels
//! (see `qem::frame_major`).
//!
//! Four kernels, chosen at run time by [`Kernel::best`]: AVX-512 (four
//! 16-lane registers; with VBMI2 where present, whose double shift takes
//! the renormalisation bytes in with one instruction instead of four),
//! AVX2 (two passes of four 8-lane registers) and portable scalar lanes. All compute exactly the steps of
//! `rans::step`; none tests for the end of a stream inside a call:
//! the caller bounds the bytes a call can read (at most `STEP_BYTES` per
//! step plus `WINDOW`) and compares each lane's position with its
//! stream's end after the call.
//!
//! The SIMD kernels are branch-free: each step gathers every lane's slot
//! entry and the 4 stream bytes at its position, which hold both the
//! renormalisation bytes and, after them, an escape's value; many
//! independent lanes hide the gathers' latency. (Variants that skipped the
//! table gather while all lanes decoded symbol 0 or 1, and kept byte
//! windows per lane, were 25% slower with AVX-512 on low-dose data and no
//! faster with AVX2.)

use std::sync::OnceLock;

use super::rans::{all_slot_tables, step, IDLE_TABLE};
use super::tables::{ESCAPE, SCALE_BITS, STATE_LOWER, TABLES};

/// Streams per group, for every kernel (a 128-byte row of u16 values).
pub(crate) const LANES: usize = 64;
/// Most bytes one step consumes (two renormalisation bytes, an escape).
pub(crate) const STEP_BYTES: usize = 4;
/// Bytes a kernel reads at a lane's position.
pub(crate) const WINDOW: usize = 4;

/// A decoding kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Portable,
    Avx2,
    Avx512,
    /// AVX-512 with VBMI2's `vpshldvd`.
    Avx512Vbmi2,
}

impl Kernel {
    /// Fastest first.
    pub const ALL: [Kernel; 4] = [
        Kernel::Avx512Vbmi2,
        Kernel::Avx512,
        Kernel::Avx2,
        Kernel::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Avx512Vbmi2 => "avx512vbmi2",
        }
    }

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512cd")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vbmi2 => {
                Kernel::Avx512.available() && is_x86_feature_detected!("avx512vbmi2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs, unless `QEMFS_KERNEL`
    /// (`avx512vbmi2`, `avx512`, `avx2`, `portable`) names another available one: for comparing
    /// kernels on one machine.
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            let wanted = std::env::var("QEMFS_KERNEL").ok();
            let fastest = Kernel::ALL.into_iter().find(|k| k.available());
            Kernel::ALL
                .into_iter()
                .find(|k| k.available() && wanted.as_deref() == Some(k.name()))
                .or(fastest)
                .unwrap_or(Kernel::Portable)
        })
    }
}

/// The widest vector instructions a SIMD loop of the library may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Width {
    Portable,
    Avx2,
    Avx512,
}

impl Kernel {
    /// The vector instructions this kernel uses.
    pub fn width(self) -> Width {
        match self {
            Kernel::Portable => Width::Portable,
            Kernel::Avx2 => Width::Avx2,
            Kernel::Avx512 | Kernel::Avx512Vbmi2 => Width::Avx512,
        }
    }
}

/// The one rule for every SIMD loop beside the decoding kernels (the
/// spatial index's tile sums, the reductions' slab loops, the reference
/// decoder's lanes): the width of the chosen kernel ([`Kernel::best`]).
/// So `QEMFS_KERNEL=avx2` runs every path an AVX2-only machine runs, and a
/// CPU's features are looked up in one place. A loop of width `w` may use
/// the instructions of every kernel of that width (`avx512f`, `avx512bw`
/// and `avx512cd` for AVX-512; `avx2` for AVX2): [`Kernel::available`]
/// checked them.
pub fn width() -> Width {
    Kernel::best().width()
}

/// The state of [`LANES`] streams between calls. Positions are byte
/// indices into the buffer the group is run on (always the same one).
#[derive(Clone)]
#[repr(C, align(64))]
pub(crate) struct Group {
    pub x: [u32; LANES],
    pub pos: [u32; LANES],
    /// Where each lane's stream ends (the idle lane: at its position).
    pub end: [u32; LANES],
    /// Per lane: `table * 1024`, where its slot lookup starts.
    base: [u32; LANES],
}

impl Default for Group {
    fn default() -> Self {
        let mut g = Group {
            x: [STATE_LOWER; LANES],
            pos: [0; LANES],
            end: [0; LANES],
            base: [0; LANES],
        };
        for j in 0..LANES {
            g.set_idle(j, 0);
        }
        g
    }
}

impl Group {
    /// Lane `j` decodes the stream at `start..end` of the buffer with
    /// `table` (`< 64`) from state `x` (already past its 4 state bytes:
    /// `start` is the first byte after them).
    pub fn set_lane(&mut self, j: usize, table: usize, x: u32, start: u32, end: u32) {
        assert!(table < TABLES, "rANS table {table}");
        self.x[j] = x;
        self.pos[j] = start;
        self.end[j] = end;
        self.base[j] = (table << SCALE_BITS) as u32;
    }

    /// Lane `j` yields 0 at every step, reading nothing (the idle table at
    /// position `at`, which must lie in the buffer).
    pub fn set_idle(&mut self, j: usize, at: u32) {
        self.x[j] = STATE_LOWER;
        self.pos[j] = at;
        self.end[j] = at;
        self.base[j] = (IDLE_TABLE << SCALE_BITS) as u32;
    }

    /// Whether no lane has read past its stream's end.
    pub fn within(&self) -> bool {
        // A fold, not `all`: without the early exit it is vectorised (it
        // runs after every call).
        self.pos
            .iter()
            .zip(&self.end)
            .fold(true, |ok, (p, e)| ok & (p <= e))
    }

    /// Whether every lane ended exactly: final state `2^23` at its end.
    pub fn clean(&self) -> bool {
        self.within() && self.pos == self.end && self.x.iter().all(|&x| x == STATE_LOWER)
    }

    /// Runs one step of every lane per row of `rows` with `kernel`,
    /// writing the values of step t as little-endian u16 to
    /// `rows[t][at..at + 2 * LANES]`. The rows are separate slices, so a
    /// part of the detector decodes straight into its columns of each
    /// output frame beside the other parts. Each lane must have
    /// `STEP_BYTES * n + WINDOW` bytes of `buf` from its position on and
    /// `buf.len() <= i32::MAX` (asserted by each kernel before it starts:
    /// [`check_bounds`](Self::check_bounds)).
    pub fn run(&mut self, kernel: Kernel, buf: &[u8], rows: &mut [&mut [u8]], at: usize) {
        if rows.is_empty() {
            return;
        }
        assert!(kernel.available(), "{} kernel not available", kernel.name());
        match kernel {
            Kernel::Portable => {
                self.check_bounds(buf, rows, at);
                self.run_portable(buf, rows, at)
            }
            // SAFETY: the feature is present (asserted); each kernel
            // asserts `check_bounds` before it reads or stores anything.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { x86::avx2(self, buf, rows, at) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { x86::avx512(self, buf, rows, at) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vbmi2 => unsafe { x86::avx512_vbmi2(self, buf, rows, at) },

            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("checked available"),
        }
    }

    /// What makes the kernels' unchecked reads and stores sound: every
    /// lane has `STEP_BYTES` per row plus `WINDOW` bytes of `buf` from its
    /// position on, positions fit `i32`, every row holds `at + 2 * LANES`
    /// bytes. Inlined into each kernel, so that the compiler vectorises
    /// the scan of the positions with that kernel's instructions.
    #[inline(always)]
    fn check_bounds(&self, buf: &[u8], rows: &[&mut [u8]], at: usize) {
        assert!(buf.len() <= i32::MAX as usize, "lane buffer too large");
        let reach = STEP_BYTES * rows.len() + WINDOW;
        let far = self.pos.iter().fold(0, |far, &p| far.max(p));
        assert!(far as usize + reach <= buf.len(), "lane buffer too short");
        assert!(
            rows.iter().all(|row| row.len() >= at + 2 * LANES),
            "row output too small"
        );
    }

    fn run_portable(&mut self, buf: &[u8], rows: &mut [&mut [u8]], at: usize) {
        let tables = all_slot_tables();
        for row in rows.iter_mut() {
            for (j, out) in row[at..at + 2 * LANES].chunks_exact_mut(2).enumerate() {
                let table = &tables[(self.base[j] >> SCALE_BITS) as usize];
                let (x, i, v) = step(table, buf, self.x[j], self.pos[j] as usize);
                self.x[j] = x;
                self.pos[j] = i as u32;
                out.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{all_slot_tables, Group, ESCAPE, LANES, SCALE_BITS, STATE_LOWER};

    const SLOT_MASK: i32 = (1 << SCALE_BITS) - 1;
    /// Lanes the AVX2 kernel holds in registers at once.
    const HALF: usize = 32;

    /// # Safety
    /// AVX-512 F, BW and CD present. The bounds the unchecked reads and
    /// stores rely on are asserted first (`Group::check_bounds`).
    ///
    /// Branch-free: every step gathers each lane's table entry and the 4
    /// stream bytes at its position (renormalisation bytes, then the escape
    /// word), with four independent registers of 16 lanes in flight.
    #[target_feature(enable = "avx512f,avx512bw,avx512cd")]
    pub(super) unsafe fn avx512(g: &mut Group, buf: &[u8], rows: &mut [&mut [u8]], at: usize) {
        g.check_bounds(buf, rows, at);
        avx512_steps::<false>(g, buf, rows, at)
    }

    /// # Safety
    /// As for [`avx512`], and AVX-512 VBMI2 present.
    #[target_feature(enable = "avx512f,avx512bw,avx512cd,avx512vbmi2")]
    pub(super) unsafe fn avx512_vbmi2(
        g: &mut Group,
        buf: &[u8],
        rows: &mut [&mut [u8]],
        at: usize,
    ) {
        g.check_bounds(buf, rows, at);
        avx512_steps::<true>(g, buf, rows, at)
    }

    /// The steps of [`avx512`]; `VBMI2`: the state takes its bytes in by
    /// one double shift. Inlined into the callers above, which enable the
    /// features its instructions need.
    #[inline(always)]
    unsafe fn avx512_steps<const VBMI2: bool>(
        g: &mut Group,
        buf: &[u8],
        rows: &mut [&mut [u8]],
        at: usize,
    ) {
        const V: usize = LANES / 16;
        let table = all_slot_tables().as_ptr() as *const i32;
        let bytes = buf.as_ptr() as *const i32;
        let z = _mm512_setzero_si512();
        let (mut vx, mut vp, mut base) = ([z; V], [z; V], [z; V]);
        for v in 0..V {
            vx[v] = _mm512_loadu_si512(g.x.as_ptr().add(16 * v) as *const __m512i);
            vp[v] = _mm512_loadu_si512(g.pos.as_ptr().add(16 * v) as *const __m512i);
            base[v] = _mm512_loadu_si512(g.base.as_ptr().add(16 * v) as *const __m512i);
        }
        let mask = _mm512_set1_epi32(SLOT_MASK);
        let sym_mask = _mm512_set1_epi32(63);
        let one = _mm512_set1_epi32(1);
        let not7 = _mm512_set1_epi32(!7);
        let c32 = _mm512_set1_epi32(32);
        let c16 = _mm512_set1_epi32(16);
        let escape = _mm512_set1_epi32(ESCAPE as i32);
        let bswap = _mm512_set_epi8(
            60, 61, 62, 63, 56, 57, 58, 59, 52, 53, 54, 55, 48, 49, 50, 51, 44, 45, 46, 47, 40, 41,
            42, 43, 36, 37, 38, 39, 32, 33, 34, 35, 28, 29, 30, 31, 24, 25, 26, 27, 20, 21, 22, 23,
            16, 17, 18, 19, 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,
        );
        let evens = _mm512_set_epi16(
            62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20,
            18, 16, 14, 12, 10, 8, 6, 4, 2, 0,
        );
        for out in rows.iter_mut() {
            let mut vals = [z; V];
            for v in 0..V {
                // (x & 1023) | table * 1024: the bits do not overlap.
                let idx = _mm512_ternarylogic_epi32::<0xEA>(vx[v], mask, base[v]);
                // SAFETY: idx < 65 * 1024 table entries.
                let e = _mm512_i32gather_epi32::<4>(idx, table);
                let y = _mm512_add_epi32(
                    _mm512_mullo_epi32(
                        _mm512_srli_epi32::<16>(e),
                        _mm512_srli_epi32::<{ SCALE_BITS }>(vx[v]),
                    ),
                    _mm512_and_si512(e, mask),
                );
                let sym = _mm512_and_si512(_mm512_srli_epi32::<10>(e), sym_mask);
                let esc = _mm512_cmpeq_epi32_mask(sym, escape);
                // y lies in [2^13, 2^31): 8 * (bytes to shift in) is
                // (leading zeros - 1) rounded down to a multiple of 8.
                let sh = _mm512_and_si512(_mm512_sub_epi32(_mm512_lzcnt_epi32(y), one), not7);
                // SAFETY: pos + 4 <= pos0 + 4n + 4 <= buf.len().
                let w = _mm512_i32gather_epi32::<1>(vp[v], bytes);
                let be = _mm512_shuffle_epi8(w, bswap);
                vx[v] = if VBMI2 {
                    // The high half of (y : be) << sh; sh < 32.
                    _mm512_shldv_epi32(y, be, sh)
                } else {
                    // Shifts by 32 give 0, as wanted when no byte comes in.
                    _mm512_or_si512(
                        _mm512_sllv_epi32(y, sh),
                        _mm512_srlv_epi32(be, _mm512_sub_epi32(c32, sh)),
                    )
                };
                // An escape's value is the little-endian word after the
                // renormalisation bytes (the pack keeps the low 16 bits).
                vals[v] = _mm512_mask_mov_epi32(sym, esc, _mm512_srlv_epi32(w, sh));
                let used = _mm512_mask_add_epi32(sh, esc, sh, c16);
                vp[v] = _mm512_add_epi32(vp[v], _mm512_srli_epi32::<3>(used));
            }
            let row = out.as_mut_ptr().add(at);
            for h in 0..V / 2 {
                let packed = _mm512_permutex2var_epi16(vals[2 * h], evens, vals[2 * h + 1]);
                _mm512_storeu_si512(row.add(64 * h) as *mut __m512i, packed);
            }
        }
        for v in 0..V {
            _mm512_storeu_si512(g.x.as_mut_ptr().add(16 * v) as *mut __m512i, vx[v]);
            _mm512_storeu_si512(g.pos.as_mut_ptr().add(16 * v) as *mut __m512i, vp[v]);
        }
    }

    /// # Safety
    /// AVX2 present; bounds asserted as in [`avx512`].
    ///
    /// The same branch-free steps in two passes of 32 lanes (four 8-lane
    /// registers each: AVX2 has 16 registers).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(g: &mut Group, buf: &[u8], rows: &mut [&mut [u8]], at: usize) {
        g.check_bounds(buf, rows, at);
        for o in (0..LANES).step_by(HALF) {
            avx2_half(g, o, buf, rows, at);
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2_half(g: &mut Group, o: usize, buf: &[u8], rows: &mut [&mut [u8]], at: usize) {
        const V: usize = HALF / 8;
        let table = all_slot_tables().as_ptr() as *const i32;
        let bytes = buf.as_ptr() as *const i32;
        let z = _mm256_setzero_si256();
        let (mut vx, mut vp, mut base) = ([z; V], [z; V], [z; V]);
        for v in 0..V {
            vx[v] = _mm256_loadu_si256(g.x.as_ptr().add(o + 8 * v) as *const __m256i);
            vp[v] = _mm256_loadu_si256(g.pos.as_ptr().add(o + 8 * v) as *const __m256i);
            base[v] = _mm256_loadu_si256(g.base.as_ptr().add(o + 8 * v) as *const __m256i);
        }
        let mask = _mm256_set1_epi32(SLOT_MASK);
        let sym_mask = _mm256_set1_epi32(63);
        let lower = _mm256_set1_epi32(STATE_LOWER as i32);
        let lower2 = _mm256_set1_epi32(1 << 15);
        let c8 = _mm256_set1_epi32(8);
        let c2 = _mm256_set1_epi32(2);
        let c32 = _mm256_set1_epi32(32);
        let low16 = _mm256_set1_epi32(0xffff);
        let escape = _mm256_set1_epi32(ESCAPE as i32);
        let bswap = _mm256_setr_epi8(
            3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10,
            9, 8, 15, 14, 13, 12,
        );
        for out in rows.iter_mut() {
            let mut vals = [z; V];
            for v in 0..V {
                let idx = _mm256_or_si256(_mm256_and_si256(vx[v], mask), base[v]);
                // SAFETY: idx < 65 * 1024 table entries.
                let e = _mm256_i32gather_epi32::<4>(table, idx);
                let y = _mm256_add_epi32(
                    _mm256_mullo_epi32(
                        _mm256_srli_epi32::<16>(e),
                        _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(vx[v]),
                    ),
                    _mm256_and_si256(e, mask),
                );
                let sym = _mm256_and_si256(_mm256_srli_epi32::<10>(e), sym_mask);
                let esc = _mm256_cmpeq_epi32(sym, escape);
                // y < 2^31: signed compares are exact.
                let sh = _mm256_add_epi32(
                    _mm256_and_si256(_mm256_cmpgt_epi32(lower, y), c8),
                    _mm256_and_si256(_mm256_cmpgt_epi32(lower2, y), c8),
                );
                // SAFETY: pos + 4 <= pos0 + 4n + 4 <= buf.len().
                let w = _mm256_i32gather_epi32::<1>(bytes, vp[v]);
                let be = _mm256_shuffle_epi8(w, bswap);
                vx[v] = _mm256_or_si256(
                    _mm256_sllv_epi32(y, sh),
                    _mm256_srlv_epi32(be, _mm256_sub_epi32(c32, sh)),
                );
                let word = _mm256_and_si256(_mm256_srlv_epi32(w, sh), low16);
                vals[v] = _mm256_blendv_epi8(sym, word, esc);
                vp[v] = _mm256_add_epi32(
                    vp[v],
                    _mm256_add_epi32(_mm256_srli_epi32::<3>(sh), _mm256_and_si256(esc, c2)),
                );
            }
            let row = out.as_mut_ptr().add(at + 2 * o);
            for h in 0..V / 2 {
                let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(
                    vals[2 * h],
                    vals[2 * h + 1],
                ));
                _mm256_storeu_si256(row.add(32 * h) as *mut __m256i, packed);
            }
        }
        for v in 0..V {
            _mm256_storeu_si256(g.x.as_mut_ptr().add(o + 8 * v) as *mut __m256i, vx[v]);
            _mm256_storeu_si256(g.pos.as_mut_ptr().add(o + 8 * v) as *mut __m256i, vp[v]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel this CPU runs asserts its bounds before it reads or
    /// stores: a lane too near the buffer's end, or a row too short for
    /// the lanes at `at`, panics instead of reading or writing out of
    /// bounds (the kernels' accesses are unchecked).
    #[test]
    fn every_kernel_refuses_runs_out_of_bounds() {
        use std::io::Write;
        use std::panic::{catch_unwind, AssertUnwindSafe};
        let buf = vec![0u8; 4096];
        let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.available()).collect();
        // Not captured by the harness: CI output names what ran.
        writeln!(std::io::stderr(), "lanes: bounds asserted by {kernels:?}").unwrap();
        for kernel in kernels {
            let run = |pos: u32, row_len: usize, at: usize| {
                let mut g = Group::default();
                g.set_idle(7, pos);
                let mut rows = vec![vec![0u8; row_len]; 3];
                let mut rows: Vec<&mut [u8]> = rows.iter_mut().map(|r| &mut r[..]).collect();
                catch_unwind(AssertUnwindSafe(|| g.run(kernel, &buf, &mut rows, at))).is_ok()
            };
            let room = (buf.len() - STEP_BYTES * 3 - WINDOW) as u32;
            assert!(
                run(room, 2 * LANES + 10, 10),
                "{kernel:?}: a run within bounds"
            );
            assert!(
                !run(room + 1, 2 * LANES + 10, 10),
                "{kernel:?}: past the buffer"
            );
            assert!(!run(0, 2 * LANES + 9, 10), "{kernel:?}: past a row");
        }
    }
}
