//! Lane groups: [`LANES`] rANS streams (§7.1) decoded in lockstep, a few
//! steps per call, their values of one step written as one row of a
//! frame-major block. The state lives in a [`Group`] between calls, so that
//! a block can be decoded a slab of frames at a time across all its pixels
//! (see [`super::frame_major`]).
//!
//! Three kernels, chosen at run time by [`Kernel::best`]: AVX-512 (two
//! 16-lane registers), AVX2 (four 8-lane registers) and portable scalar
//! lanes. All compute exactly the steps of [`super::rans::step`]; none tests
//! for the end of a stream inside a call: the caller bounds the bytes a call
//! can read (at most [`STEP_BYTES`] per step plus [`WINDOW`]) and compares
//! each lane's position with its stream's end after the call.
//!
//! The SIMD kernels use two observations about low-dose data. While every
//! lane's slot falls on symbol 0 or 1 (most steps), the frequency and start
//! come from per-lane constants instead of a table gather. And a lane
//! renormalises only every few dozen steps, so each lane keeps its next 12
//! stream bytes in three big-endian words, gathered anew only when some lane
//! has used more than 8 of them: the byte gathers, slow and otherwise on
//! the state's dependency chain, leave the common step.

use std::sync::OnceLock;

use super::rans::{all_slot_tables, step, IDLE_TABLE};
use super::tables::{ESCAPE, FREQUENCIES, SCALE_BITS, STATE_LOWER, TABLES};

/// Streams per group, for every kernel (one 64-byte row of u16 values).
pub const LANES: usize = 32;
/// Most bytes one step consumes (two renormalisation bytes, an escape).
pub const STEP_BYTES: usize = 4;
/// Bytes a SIMD kernel reads ahead of a lane's position.
pub const WINDOW: usize = 12;

/// A decoding kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Portable,
    Avx2,
    Avx512,
}

impl Kernel {
    pub const ALL: [Kernel; 3] = [Kernel::Avx512, Kernel::Avx2, Kernel::Portable];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
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
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs, unless `QEMFS_KERNEL` (`avx512`,
    /// `avx2`, `portable`) names another available one: for comparing
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

/// The state of [`LANES`] streams between calls. Positions are byte
/// indices into the buffer the group is run on (always the same one).
#[derive(Clone)]
#[repr(C, align(64))]
pub struct Group {
    pub x: [u32; LANES],
    pub pos: [u32; LANES],
    /// Where each lane's stream ends (the idle lane: at its position).
    pub end: [u32; LANES],
    /// The SIMD kernels' byte windows (big-endian words) and the position
    /// past which a window is refilled.
    win: [[u32; LANES]; 3],
    limit: [u32; LANES],
    /// Per lane: `table * 1024`, frequency of symbol 0 and of symbol 1,
    /// start of symbol 1 minus 1 and of symbol 2 minus 1.
    base: [u32; LANES],
    f0: [u32; LANES],
    f1: [u32; LANES],
    c1m1: [u32; LANES],
    c2m1: [u32; LANES],
    /// Whether the windows hold the bytes at the positions.
    primed: bool,
}

impl Default for Group {
    fn default() -> Self {
        let mut g = Group {
            x: [STATE_LOWER; LANES],
            pos: [0; LANES],
            end: [0; LANES],
            win: [[0; LANES]; 3],
            limit: [0; LANES],
            base: [0; LANES],
            f0: [0; LANES],
            f1: [0; LANES],
            c1m1: [0; LANES],
            c2m1: [0; LANES],
            primed: false,
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
        let f = &FREQUENCIES[table];
        self.x[j] = x;
        self.pos[j] = start;
        self.end[j] = end;
        self.base[j] = (table << SCALE_BITS) as u32;
        self.f0[j] = u32::from(f[0]);
        self.f1[j] = u32::from(f[1]);
        self.c1m1[j] = u32::from(f[0]) - 1;
        self.c2m1[j] = u32::from(f[0] + f[1]) - 1;
        self.primed = false;
    }

    /// Lane `j` yields 0 at every step, reading nothing (the idle table at
    /// position `at`, which must lie in the buffer).
    pub fn set_idle(&mut self, j: usize, at: u32) {
        self.x[j] = STATE_LOWER;
        self.pos[j] = at;
        self.end[j] = at;
        self.base[j] = (IDLE_TABLE << SCALE_BITS) as u32;
        self.f0[j] = 1 << SCALE_BITS;
        self.f1[j] = 1;
        self.c1m1[j] = (1 << SCALE_BITS) - 1;
        self.c2m1[j] = (1 << SCALE_BITS) - 1;
        self.primed = false;
    }

    /// Whether no lane has read past its stream's end.
    pub fn within(&self) -> bool {
        self.pos.iter().zip(&self.end).all(|(p, e)| p <= e)
    }

    /// Whether every lane ended exactly: final state `2^23` at its end.
    pub fn clean(&self) -> bool {
        self.within() && self.pos == self.end && self.x.iter().all(|&x| x == STATE_LOWER)
    }

    /// Runs `n` steps of every lane with `kernel`, writing the values of
    /// step t as little-endian u16 to `rows[2 * t * stride..][..2 * LANES]`.
    /// Each lane must have `STEP_BYTES * n + WINDOW` bytes of `buf` from
    /// its position on and `buf.len() <= i32::MAX` (asserted; that is what
    /// makes the kernels' unchecked reads sound).
    pub fn run(&mut self, kernel: Kernel, buf: &[u8], rows: &mut [u8], stride: usize, n: usize) {
        if n == 0 {
            return;
        }
        assert!(buf.len() <= i32::MAX as usize, "lane buffer too large");
        let reach = STEP_BYTES * n + WINDOW;
        assert!(
            self.pos.iter().all(|&p| p as usize + reach <= buf.len()),
            "lane buffer too short"
        );
        assert!(
            stride >= LANES && rows.len() >= 2 * ((n - 1) * stride + LANES),
            "row output too small"
        );
        assert!(kernel.available(), "{} kernel not available", kernel.name());
        match kernel {
            Kernel::Portable => self.run_portable(buf, rows, stride, n),
            // SAFETY: the feature is present (asserted), every read stays
            // within `buf` and every store within `rows` (asserted above).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { x86::avx2(self, buf, rows, stride, n) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { x86::avx512(self, buf, rows, stride, n) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("checked available"),
        }
    }

    fn run_portable(&mut self, buf: &[u8], rows: &mut [u8], stride: usize, n: usize) {
        let tables = all_slot_tables();
        for t in 0..n {
            let row = &mut rows[2 * t * stride..2 * (t * stride + LANES)];
            for (j, out) in row.chunks_exact_mut(2).enumerate() {
                let table = &tables[(self.base[j] >> SCALE_BITS) as usize];
                let (x, i, v) = step(table, buf, self.x[j], self.pos[j] as usize);
                self.x[j] = x;
                self.pos[j] = i as u32;
                out.copy_from_slice(&v.to_le_bytes());
            }
        }
        self.primed = false;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{all_slot_tables, Group, ESCAPE, LANES, SCALE_BITS, STATE_LOWER};

    const SLOT_MASK: i32 = (1 << SCALE_BITS) - 1;

    /// Finishes the escaped lanes `esc` of lanes `j0..j0 + W` in scalar
    /// code: the value is the u16 at the lane's position, 2 bytes more.
    #[inline(always)]
    fn escapes<const W: usize>(buf: &[u8], esc: u32, vals: &mut [i32; W], pos: &mut [i32; W]) {
        for j in 0..W {
            if esc & (1 << j) != 0 {
                let p = pos[j] as usize;
                vals[j] = i32::from(u16::from_le_bytes([buf[p], buf[p + 1]]));
                pos[j] += 2;
            }
        }
    }

    /// # Safety
    /// AVX2 present; for every lane `pos + 4n + 12 <= buf.len() <=
    /// i32::MAX`; `rows` holds `2 * ((n - 1) * stride + LANES)` bytes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(g: &mut Group, buf: &[u8], rows: &mut [u8], stride: usize, n: usize) {
        const V: usize = LANES / 8;
        let table = all_slot_tables().as_ptr() as *const i32;
        let bytes = buf.as_ptr() as *const i32;
        let ld = |a: &[u32; LANES], v: usize| {
            _mm256_loadu_si256(a.as_ptr().add(8 * v) as *const __m256i)
        };
        let st = |a: &mut [u32; LANES], v: usize, x: __m256i| {
            _mm256_storeu_si256(a.as_mut_ptr().add(8 * v) as *mut __m256i, x)
        };
        let bswap = _mm256_setr_epi8(
            3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10,
            9, 8, 15, 14, 13, 12,
        );
        // SAFETY (all fetches): a window is fetched at a lane's position
        // after k <= n steps, 12 bytes from pos0 + 4k <= pos0 + 4n.
        let fetch = |p: __m256i| _mm256_shuffle_epi8(_mm256_i32gather_epi32::<1>(bytes, p), bswap);
        let c4 = _mm256_set1_epi32(4);
        let c8 = _mm256_set1_epi32(8);
        let refill = |p: __m256i| {
            let limit = _mm256_add_epi32(p, c8);
            (
                fetch(p),
                fetch(_mm256_add_epi32(p, c4)),
                fetch(limit),
                limit,
            )
        };
        let z = _mm256_setzero_si256();
        let (mut vx, mut vp, mut wa, mut wb, mut wc, mut limit) =
            ([z; V], [z; V], [z; V], [z; V], [z; V], [z; V]);
        let (mut base, mut f0, mut f1, mut c1m1, mut c2m1) =
            ([z; V], [z; V], [z; V], [z; V], [z; V]);
        for v in 0..V {
            vx[v] = ld(&g.x, v);
            vp[v] = ld(&g.pos, v);
            base[v] = ld(&g.base, v);
            f0[v] = ld(&g.f0, v);
            f1[v] = ld(&g.f1, v);
            c1m1[v] = ld(&g.c1m1, v);
            c2m1[v] = ld(&g.c2m1, v);
            if g.primed {
                wa[v] = ld(&g.win[0], v);
                wb[v] = ld(&g.win[1], v);
                wc[v] = ld(&g.win[2], v);
                limit[v] = ld(&g.limit, v);
            } else {
                (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
            }
        }
        let mask = _mm256_set1_epi32(SLOT_MASK);
        let lower = _mm256_set1_epi32(STATE_LOWER as i32);
        let lower2 = _mm256_set1_epi32(1 << 15);
        let c32 = _mm256_set1_epi32(32);
        let sym_mask = _mm256_set1_epi32(63);
        let escape = _mm256_set1_epi32(ESCAPE as i32);
        let mut y = [z; V];
        let mut vals = [z; V];
        for t in 0..n {
            let mut slot = [z; V];
            let mut any_ge2 = z;
            for v in 0..V {
                slot[v] = _mm256_and_si256(vx[v], mask);
                any_ge2 = _mm256_or_si256(any_ge2, _mm256_cmpgt_epi32(slot[v], c2m1[v]));
            }
            let mut any_esc = z;
            if _mm256_testz_si256(any_ge2, any_ge2) != 0 {
                // Every lane's symbol is 0 or 1: per-lane constants.
                for v in 0..V {
                    let hi = _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(vx[v]);
                    let ge1 = _mm256_cmpgt_epi32(slot[v], c1m1[v]);
                    let f = _mm256_blendv_epi8(f0[v], f1[v], ge1);
                    y[v] = _mm256_add_epi32(
                        _mm256_mullo_epi32(f, hi),
                        _mm256_sub_epi32(slot[v], _mm256_and_si256(ge1, f0[v])),
                    );
                    vals[v] = _mm256_srli_epi32::<31>(ge1);
                }
            } else {
                for v in 0..V {
                    let hi = _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(vx[v]);
                    // SAFETY: base + slot < 65 * 1024 entries.
                    let e = _mm256_i32gather_epi32::<4>(table, _mm256_add_epi32(base[v], slot[v]));
                    y[v] = _mm256_add_epi32(
                        _mm256_mullo_epi32(_mm256_srli_epi32::<16>(e), hi),
                        _mm256_and_si256(e, mask),
                    );
                    vals[v] = _mm256_and_si256(_mm256_srli_epi32::<10>(e), sym_mask);
                    any_esc = _mm256_or_si256(any_esc, _mm256_cmpeq_epi32(vals[v], escape));
                }
            }
            let mut any_spent = z;
            for v in 0..V {
                // y < 2^31: signed compares are exact; n = 0, 1 or 2 bytes.
                let nb = _mm256_sub_epi32(
                    z,
                    _mm256_add_epi32(
                        _mm256_cmpgt_epi32(lower, y[v]),
                        _mm256_cmpgt_epi32(lower2, y[v]),
                    ),
                );
                let sh = _mm256_slli_epi32::<3>(nb);
                let rsh = _mm256_sub_epi32(c32, sh);
                // Shifts by 32 give 0 in AVX2, as wanted when n = 0.
                let shift_in = |hi: __m256i, lo: __m256i| {
                    _mm256_or_si256(_mm256_sllv_epi32(hi, sh), _mm256_srlv_epi32(lo, rsh))
                };
                vx[v] = shift_in(y[v], wa[v]);
                wa[v] = shift_in(wa[v], wb[v]);
                wb[v] = shift_in(wb[v], wc[v]);
                wc[v] = _mm256_sllv_epi32(wc[v], sh);
                vp[v] = _mm256_add_epi32(vp[v], nb);
                any_spent = _mm256_or_si256(any_spent, _mm256_cmpgt_epi32(vp[v], limit[v]));
            }
            if _mm256_testz_si256(any_spent, any_spent) == 0 {
                for v in 0..V {
                    (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
                }
            }
            if _mm256_testz_si256(any_esc, any_esc) == 0 {
                for v in 0..V {
                    let esc = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
                        vals[v], escape,
                    ))) as u32;
                    if esc == 0 {
                        continue;
                    }
                    let (mut val, mut at) = ([0i32; 8], [0i32; 8]);
                    _mm256_storeu_si256(val.as_mut_ptr() as *mut __m256i, vals[v]);
                    _mm256_storeu_si256(at.as_mut_ptr() as *mut __m256i, vp[v]);
                    escapes::<8>(buf, esc, &mut val, &mut at);
                    vals[v] = _mm256_loadu_si256(val.as_ptr() as *const __m256i);
                    vp[v] = _mm256_loadu_si256(at.as_ptr() as *const __m256i);
                    (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
                }
            }
            // Values are below 2^16: a pack gives 16 lanes as quarters
            // (0-3, 8-11, 4-7, 12-15), put in order by one permutation.
            let row = rows.as_mut_ptr().add(2 * t * stride);
            for h in 0..V / 2 {
                let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(
                    vals[2 * h],
                    vals[2 * h + 1],
                ));
                _mm256_storeu_si256(row.add(32 * h) as *mut __m256i, packed);
            }
        }
        for v in 0..V {
            st(&mut g.x, v, vx[v]);
            st(&mut g.pos, v, vp[v]);
            st(&mut g.win[0], v, wa[v]);
            st(&mut g.win[1], v, wb[v]);
            st(&mut g.win[2], v, wc[v]);
            st(&mut g.limit, v, limit[v]);
        }
        g.primed = true;
    }

    /// # Safety
    /// AVX-512 F, BW and CD present; bounds as for [`avx2`].
    #[target_feature(enable = "avx512f,avx512bw,avx512cd")]
    pub(super) unsafe fn avx512(
        g: &mut Group,
        buf: &[u8],
        rows: &mut [u8],
        stride: usize,
        n: usize,
    ) {
        const V: usize = LANES / 16;
        let table = all_slot_tables().as_ptr() as *const i32;
        let bytes = buf.as_ptr() as *const i32;
        let ld = |a: &[u32; LANES], v: usize| {
            _mm512_loadu_si512(a.as_ptr().add(16 * v) as *const __m512i)
        };
        let st = |a: &mut [u32; LANES], v: usize, x: __m512i| {
            _mm512_storeu_si512(a.as_mut_ptr().add(16 * v) as *mut __m512i, x)
        };
        let bswap = _mm512_set_epi8(
            60, 61, 62, 63, 56, 57, 58, 59, 52, 53, 54, 55, 48, 49, 50, 51, 44, 45, 46, 47, 40, 41,
            42, 43, 36, 37, 38, 39, 32, 33, 34, 35, 28, 29, 30, 31, 24, 25, 26, 27, 20, 21, 22, 23,
            16, 17, 18, 19, 12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,
        );
        // SAFETY (all fetches): as in `avx2`.
        let fetch = |p: __m512i| _mm512_shuffle_epi8(_mm512_i32gather_epi32::<1>(p, bytes), bswap);
        let c4 = _mm512_set1_epi32(4);
        let c8 = _mm512_set1_epi32(8);
        let refill = |p: __m512i| {
            let limit = _mm512_add_epi32(p, c8);
            (
                fetch(p),
                fetch(_mm512_add_epi32(p, c4)),
                fetch(limit),
                limit,
            )
        };
        let z = _mm512_setzero_si512();
        let (mut vx, mut vp, mut wa, mut wb, mut wc, mut limit) =
            ([z; V], [z; V], [z; V], [z; V], [z; V], [z; V]);
        let (mut base, mut f0, mut f1, mut c1m1, mut c2m1) =
            ([z; V], [z; V], [z; V], [z; V], [z; V]);
        for v in 0..V {
            vx[v] = ld(&g.x, v);
            vp[v] = ld(&g.pos, v);
            base[v] = ld(&g.base, v);
            f0[v] = ld(&g.f0, v);
            f1[v] = ld(&g.f1, v);
            c1m1[v] = ld(&g.c1m1, v);
            c2m1[v] = ld(&g.c2m1, v);
            if g.primed {
                wa[v] = ld(&g.win[0], v);
                wb[v] = ld(&g.win[1], v);
                wc[v] = ld(&g.win[2], v);
                limit[v] = ld(&g.limit, v);
            } else {
                (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
            }
        }
        let mask = _mm512_set1_epi32(SLOT_MASK);
        let one = _mm512_set1_epi32(1);
        let not7 = _mm512_set1_epi32(!7);
        let c32 = _mm512_set1_epi32(32);
        let sym_mask = _mm512_set1_epi32(63);
        let escape = _mm512_set1_epi32(ESCAPE as i32);
        // Word i of the result is word 2i of (a:b): the low halves of 32
        // lanes, in order.
        let evens = _mm512_set_epi16(
            62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20,
            18, 16, 14, 12, 10, 8, 6, 4, 2, 0,
        );
        let mut y = [z; V];
        let mut vals = [z; V];
        for t in 0..n {
            let mut slot = [z; V];
            let mut any_ge2 = 0u32;
            for v in 0..V {
                slot[v] = _mm512_and_si512(vx[v], mask);
                any_ge2 |= u32::from(_mm512_cmpgt_epi32_mask(slot[v], c2m1[v]));
            }
            let mut esc = [0u16; V];
            if any_ge2 == 0 {
                // Every lane's symbol is 0 or 1: per-lane constants.
                for v in 0..V {
                    let hi = _mm512_srli_epi32::<{ SCALE_BITS }>(vx[v]);
                    let ge1 = _mm512_cmpgt_epi32_mask(slot[v], c1m1[v]);
                    let f = _mm512_mask_blend_epi32(ge1, f0[v], f1[v]);
                    y[v] = _mm512_add_epi32(
                        _mm512_mullo_epi32(f, hi),
                        _mm512_mask_sub_epi32(slot[v], ge1, slot[v], f0[v]),
                    );
                    vals[v] = _mm512_maskz_mov_epi32(ge1, one);
                }
            } else {
                for v in 0..V {
                    let hi = _mm512_srli_epi32::<{ SCALE_BITS }>(vx[v]);
                    // SAFETY: base + slot < 65 * 1024 entries.
                    let e = _mm512_i32gather_epi32::<4>(_mm512_add_epi32(base[v], slot[v]), table);
                    y[v] = _mm512_add_epi32(
                        _mm512_mullo_epi32(_mm512_srli_epi32::<16>(e), hi),
                        _mm512_and_si512(e, mask),
                    );
                    vals[v] = _mm512_and_si512(_mm512_srli_epi32::<10>(e), sym_mask);
                    esc[v] = _mm512_cmpeq_epi32_mask(vals[v], escape);
                }
            }
            let mut any_spent = 0u32;
            for v in 0..V {
                // y lies in [2^13, 2^31): 8 * (bytes to shift in) is
                // (leading zeros - 1) rounded down to a multiple of 8.
                let sh = _mm512_and_si512(_mm512_sub_epi32(_mm512_lzcnt_epi32(y[v]), one), not7);
                let rsh = _mm512_sub_epi32(c32, sh);
                // Shifts by 32 give 0, as wanted when no byte comes in.
                let shift_in = |hi: __m512i, lo: __m512i| {
                    _mm512_or_si512(_mm512_sllv_epi32(hi, sh), _mm512_srlv_epi32(lo, rsh))
                };
                vx[v] = shift_in(y[v], wa[v]);
                wa[v] = shift_in(wa[v], wb[v]);
                wb[v] = shift_in(wb[v], wc[v]);
                wc[v] = _mm512_sllv_epi32(wc[v], sh);
                vp[v] = _mm512_add_epi32(vp[v], _mm512_srli_epi32::<3>(sh));
                any_spent |= u32::from(_mm512_cmpgt_epi32_mask(vp[v], limit[v]));
            }
            if any_spent != 0 {
                for v in 0..V {
                    (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
                }
            }
            for v in 0..V {
                if esc[v] == 0 {
                    continue;
                }
                let (mut val, mut at) = ([0i32; 16], [0i32; 16]);
                _mm512_storeu_si512(val.as_mut_ptr() as *mut __m512i, vals[v]);
                _mm512_storeu_si512(at.as_mut_ptr() as *mut __m512i, vp[v]);
                escapes::<16>(buf, u32::from(esc[v]), &mut val, &mut at);
                vals[v] = _mm512_loadu_si512(val.as_ptr() as *const __m512i);
                vp[v] = _mm512_loadu_si512(at.as_ptr() as *const __m512i);
                (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
            }
            let row = rows.as_mut_ptr().add(2 * t * stride);
            for h in 0..V / 2 {
                let packed = _mm512_permutex2var_epi16(vals[2 * h], evens, vals[2 * h + 1]);
                _mm512_storeu_si512(row.add(64 * h) as *mut __m512i, packed);
            }
        }
        for v in 0..V {
            st(&mut g.x, v, vx[v]);
            st(&mut g.pos, v, vp[v]);
            st(&mut g.win[0], v, wa[v]);
            st(&mut g.win[1], v, wb[v]);
            st(&mut g.win[2], v, wc[v]);
            st(&mut g.limit, v, limit[v]);
        }
        g.primed = true;
    }
}
