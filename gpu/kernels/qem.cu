// CUDA kernels of the qemfs-gpu CUDA backend: a line-by-line port of
// ../shaders/decode.wgsl and ../shaders/reduce.wgsl (same buffers, same
// layouts, same fault records), so both backends give the same values and
// errors. Compiled ahead of time to PTX (qem.ptx, see build-ptx.sh) and
// loaded through the driver API, so a machine needs only the CUDA driver.
//
// Written without the CUDA headers (clang -nocudainc works as well as nvcc):
// the thread indices come from the NVVM builtins.

#if defined(__clang__) && !defined(__CUDACC_VER_MAJOR__)
#define QEM_GLOBAL __attribute__((global))
#define QEM_DEVICE __attribute__((device)) static inline
#define TID_X (__nvvm_read_ptx_sreg_tid_x())
#define CTAID_X (__nvvm_read_ptx_sreg_ctaid_x())
#define CTAID_Y (__nvvm_read_ptx_sreg_ctaid_y())
#define CTAID_Z (__nvvm_read_ptx_sreg_ctaid_z())
#define NTID_X (__nvvm_read_ptx_sreg_ntid_x())
#define ATOMIC_ADD(p, v) __nvvm_atom_add_gen_i((int *)(p), (int)(v))
#define AS_FLOAT(b) __builtin_bit_cast(float, (b))
#define AS_BITS(f) __builtin_bit_cast(unsigned int, (f))
#define TRUNCF(x) __builtin_truncf(x)
#define FABSF(x) __builtin_fabsf(x)
#else
#define QEM_GLOBAL __global__
#define QEM_DEVICE __device__ static inline
#define TID_X (threadIdx.x)
#define CTAID_X (blockIdx.x)
#define CTAID_Y (blockIdx.y)
#define CTAID_Z (blockIdx.z)
#define NTID_X (blockDim.x)
#define ATOMIC_ADD(p, v) atomicAdd((p), (v))
#define AS_FLOAT(b) __uint_as_float(b)
#define AS_BITS(f) __float_as_uint(f)
#define TRUNCF(x) truncf(x)
#define FABSF(x) fabsf(x)
#endif

typedef unsigned int u32;

#define MAX_FAULTS 64u
#define FAULT_SELECTOR 1u
#define FAULT_LENGTH 2u
#define FAULT_INITIAL_STATE 3u
#define FAULT_TRUNCATED 4u
#define FAULT_TRUNCATED_ESCAPE 5u
#define FAULT_FINAL_STATE 6u
#define FAULT_SPARSE_POSITION 7u
#define FAULT_VALUE_RANGE 8u
#define STATE_LOWER 0x800000u
#define STATE_UPPER 0x80000000u

struct DecodeParams {
    u32 streams, m, byte_base, u8_limit, block, pass_index, pad0, pad1;
};

struct ReduceParams {
    u32 m, pixel0, width, columns, float_lanes, background, products, segments, seg_len,
        desc_base, frame0, batch_frames;
    float one;
    u32 pad0, pad1, pad2;
};

QEM_DEVICE u32 byte_at(const u32 *payload, u32 i) {
    return (payload[i >> 2] >> ((i & 3u) * 8u)) & 0xffu;
}

QEM_DEVICE u32 word_at(const u32 *payload, u32 i) {
    return byte_at(payload, i) | (byte_at(payload, i + 1u) << 8);
}

// faults: [count, records of 6 words: block, pass, stream in pass, code, a, b]
QEM_DEVICE void fault(u32 *faults, const DecodeParams &dp, u32 j, u32 code, u32 a, u32 b) {
    u32 k = (u32)ATOMIC_ADD(&faults[0], 1u);
    if (k < MAX_FAULTS) {
        u32 *r = faults + 1 + 6u * k;
        r[0] = dp.block;
        r[1] = dp.pass_index;
        r[2] = j;
        r[3] = code;
        r[4] = a;
        r[5] = b;
    }
}

extern "C" QEM_GLOBAL void decode(DecodeParams dp, const u32 *payload, const u32 *offsets,
                                  const u32 *selectors, const u32 *slots, u32 *scratch,
                                  u32 *faults) {
    u32 j = CTAID_X * NTID_X + TID_X;
    if (j >= dp.streams) return;
    u32 m = dp.m;
    u32 out0 = j * m;
    u32 sel = (selectors[j >> 2] >> ((j & 3u) * 8u)) & 0xffu;
    u32 start = offsets[j] - dp.byte_base;
    u32 end = offsets[j + 1u] - dp.byte_base;
    u32 len = end - start;
    bool over = false;
    u32 over_value = 0u;

    if (sel == 253u) {
        if (len != 0u) { fault(faults, dp, j, FAULT_LENGTH, sel, len); return; }
        for (u32 t = 0; t < m; t++) scratch[out0 + t] = 0u;
    } else if (sel == 255u) {
        if (len != 2u) { fault(faults, dp, j, FAULT_LENGTH, sel, len); return; }
        u32 v = word_at(payload, start);
        for (u32 t = 0; t < m; t++) scratch[out0 + t] = v;
        if (v > 255u) { over = true; over_value = v; }
    } else if (sel == 254u) {
        if (len != 2u * m) { fault(faults, dp, j, FAULT_LENGTH, sel, len); return; }
        for (u32 t = 0; t < m; t++) {
            u32 v = word_at(payload, start + 2u * t);
            scratch[out0 + t] = v;
            if (v > 255u && !over) { over = true; over_value = v; }
        }
    } else if (sel == 252u) {
        if ((len & 1u) != 0u) { fault(faults, dp, j, FAULT_LENGTH, sel, len); return; }
        for (u32 t = 0; t < m; t++) scratch[out0 + t] = 0u;
        u32 next = 0u;
        for (u32 k = 0; k < len / 2u; k++) {
            u32 e = word_at(payload, start + 2u * k);
            u32 position = e >> 7;
            if (position < next || position >= m) {
                fault(faults, dp, j, FAULT_SPARSE_POSITION, position, 0u);
                return;
            }
            scratch[out0 + position] = (e & 127u) + 1u;
            next = position + 1u;
        }
    } else if (sel < 64u) {
        if (len < 4u) { fault(faults, dp, j, FAULT_LENGTH, sel, len); return; }
        u32 x = byte_at(payload, start) | (byte_at(payload, start + 1u) << 8) |
                (byte_at(payload, start + 2u) << 16) | (byte_at(payload, start + 3u) << 24);
        if (x < STATE_LOWER || x >= STATE_UPPER) {
            fault(faults, dp, j, FAULT_INITIAL_STATE, x, 0u);
            return;
        }
        u32 i = start + 4u;
        const u32 *table = slots + sel * 1024u;
        for (u32 t = 0; t < m; t++) {
            u32 e = table[x & 1023u];
            x = (e >> 16) * (x >> 10) + (e & 1023u);
            while (x < STATE_LOWER) {
                if (i >= end) { fault(faults, dp, j, FAULT_TRUNCATED, 0u, 0u); return; }
                x = (x << 8) | byte_at(payload, i);
                i += 1u;
            }
            u32 v = (e >> 10) & 63u;
            if (v == 32u) {
                if (i + 2u > end) { fault(faults, dp, j, FAULT_TRUNCATED_ESCAPE, 0u, 0u); return; }
                v = word_at(payload, i);
                i += 2u;
            }
            scratch[out0 + t] = v;
            if (v > 255u && !over) { over = true; over_value = v; }
        }
        if (x != STATE_LOWER || i != end) {
            fault(faults, dp, j, FAULT_FINAL_STATE, x, end - i);
            return;
        }
    } else {
        fault(faults, dp, j, FAULT_SELECTOR, sel, 0u);
        return;
    }
    if (over && dp.u8_limit != 0u) fault(faults, dp, j, FAULT_VALUE_RANGE, over_value, 0u);
}

QEM_DEVICE float as_float(u32 b) { return AS_FLOAT(b); }
QEM_DEVICE u32 as_bits(float f) { return AS_BITS(f); }

QEM_DEVICE bool is_nan_bits(u32 b) { return (b & 0x7fffffffu) > 0x7f800000u; }
QEM_DEVICE bool is_finite_bits(u32 b) { return (b & 0x7f800000u) != 0x7f800000u; }
QEM_DEVICE u32 order_key(u32 b) { return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u); }

// Slot `jl` (pixel `p`) at frame `t`, background subtracted.
QEM_DEVICE float float_value(const ReduceParams &rp, const u32 *scratch, const float *background,
                             u32 jl, u32 p, u32 t) {
    u32 bits = scratch[2u * jl * rp.m + t] | (scratch[(2u * jl + 1u) * rp.m + t] << 16);
    float f = as_float(bits);
    if (rp.background != 0u) f = f - background[p];
    return f;
}

// The float accumulator of reduce.wgsl and src/reduce/neumaier.rs, step
// for step: (sum, compensation, units of 2^126, special flags 1: +inf,
// 2: -inf, 4: NaN), four words in memory; the host computes its value.
// `one` (1.0 from the host) keeps the compensation from being simplified
// away, as in reduce.wgsl.
struct Acc {
    float s, c;
    int h;
    u32 special;
};

QEM_DEVICE Acc acc_zero() { Acc a; a.s = 0.0f; a.c = 0.0f; a.h = 0; a.special = 0u; return a; }

QEM_DEVICE Acc acc_load(const u32 *w) {
    Acc a; a.s = as_float(w[0]); a.c = as_float(w[1]); a.h = (int)w[2]; a.special = w[3]; return a;
}

QEM_DEVICE void acc_store(u32 *w, const Acc &a) {
    w[0] = as_bits(a.s); w[1] = as_bits(a.c); w[2] = (u32)a.h; w[3] = a.special;
}

QEM_DEVICE int add_units(int h, int q) {
    long long v = (long long)h + q;
    return v > 1073741824 ? 1073741824 : (v < -1073741824 ? -1073741824 : (int)v);
}

QEM_DEVICE void acc_add(Acc &r, float v, float one) {
    const float unit = as_float(0x7e800000u), inv_unit = as_float(0x00800000u);
    u32 b = as_bits(v);
    if (!is_finite_bits(b)) {
        r.special |= is_nan_bits(b) ? 4u : ((b & 0x80000000u) == 0u ? 1u : 2u);
        return;
    }
    float x = v, q = 0.0f;
    if (FABSF(x) >= unit) { q = TRUNCF(x * inv_unit); x = x - q * unit; }
    float t = (r.s + x) * one;
    if (FABSF(r.s) >= FABSF(x)) r.c = r.c + ((r.s - t) + x);
    else r.c = r.c + ((x - t) + r.s);
    float s = t, q2 = 0.0f;
    if (FABSF(s) >= unit) { q2 = TRUNCF(s * inv_unit); s = s - q2 * unit; }
    r.s = s;
    r.h = add_units(r.h, (int)q + (int)q2);
}

QEM_DEVICE void acc_merge(Acc &r, const Acc &part, float one) {
    r.h = add_units(r.h, part.h);
    r.special |= part.special;
    acc_add(r, part.s, one);
    acc_add(r, part.c, one);
}

QEM_DEVICE u32 slot(const ReduceParams &rp, u32 prod, u32 seg, u32 t) {
    return 4u * ((prod * rp.segments + seg) * rp.m + t);
}

// Mode 0: a plain sum (a mask); mode 1: total, row and column moments into
// products prod..prod+2; mode 2: filled by mode 1.
extern "C" QEM_GLOBAL void segments(ReduceParams rp, const u32 *scratch, const u32 *lists,
                                    const u32 *descs, u32 *partials, const float *background,
                                    const u32 *pass_pixels) {
    u32 t = CTAID_X * NTID_X + TID_X;
    u32 seg = CTAID_Y;
    u32 prod = CTAID_Z;
    if (t >= rp.m) return;
    u32 d = rp.desc_base + 3u * prod;
    u32 start = descs[d], count = descs[d + 1u], mode = descs[d + 2u];
    if (mode == 2u) return;
    u32 a = seg * rp.seg_len < count ? seg * rp.seg_len : count;
    u32 b = a + rp.seg_len < count ? a + rp.seg_len : count;
    u32 d0 = slot(rp, prod, seg, t);
    if (rp.float_lanes != 0u) {
        Acc s0 = acc_zero(), s1 = acc_zero(), s2 = acc_zero();
        for (u32 k = a; k < b; k++) {
            u32 jl = lists[start + k];
            u32 p = pass_pixels[rp.pixel0 + jl];
            float v = float_value(rp, scratch, background, jl, p, t);
            acc_add(s0, v, rp.one);
            if (mode == 1u) {
                // Rounded products (`* one`): never fused into the sum.
                acc_add(s1, ((float)(p / rp.columns) * v) * rp.one, rp.one);
                acc_add(s2, ((float)(p % rp.columns) * v) * rp.one, rp.one);
            }
        }
        acc_store(partials + d0, s0);
        if (mode == 1u) {
            acc_store(partials + slot(rp, prod + 1u, seg, t), s1);
            acc_store(partials + slot(rp, prod + 2u, seg, t), s2);
        }
    } else {
        unsigned long long s0 = 0ull, s1 = 0ull, s2 = 0ull;
        for (u32 k = a; k < b; k++) {
            u32 jl = lists[start + k];
            unsigned long long v = scratch[jl * rp.m + t];
            s0 += v;
            if (mode == 1u) {
                u32 p = pass_pixels[rp.pixel0 + jl];
                s1 += v * (p / rp.columns);
                s2 += v * (p % rp.columns);
            }
        }
        partials[d0] = (u32)s0;
        partials[d0 + 1u] = (u32)(s0 >> 32);
        if (mode == 1u) {
            u32 d1 = slot(rp, prod + 1u, seg, t), d2 = slot(rp, prod + 2u, seg, t);
            partials[d1] = (u32)s1;
            partials[d1 + 1u] = (u32)(s1 >> 32);
            partials[d2] = (u32)s2;
            partials[d2 + 1u] = (u32)(s2 >> 32);
        }
    }
}

extern "C" QEM_GLOBAL void combine(ReduceParams rp, const u32 *partials, u32 *acc) {
    u32 t = CTAID_X * NTID_X + TID_X;
    u32 prod = CTAID_Y;
    if (t >= rp.m) return;
    u32 at = 4u * (prod * rp.batch_frames + rp.frame0 + t);
    if (rp.float_lanes != 0u) {
        Acc s = acc_load(acc + at);
        for (u32 seg = 0; seg < rp.segments; seg++) {
            acc_merge(s, acc_load(partials + slot(rp, prod, seg, t)), rp.one);
        }
        acc_store(acc + at, s);
    } else {
        unsigned long long s = (unsigned long long)acc[at] | ((unsigned long long)acc[at + 1u] << 32);
        for (u32 seg = 0; seg < rp.segments; seg++) {
            u32 i = slot(rp, prod, seg, t);
            s += (unsigned long long)partials[i] | ((unsigned long long)partials[i + 1u] << 32);
        }
        acc[at] = (u32)s;
        acc[at + 1u] = (u32)(s >> 32);
    }
}

extern "C" QEM_GLOBAL void pattern(ReduceParams rp, const u32 *scratch, const float *background,
                                   u32 *pattern_sum, u32 *pattern_max, const u32 *pass_pixels) {
    u32 jl = CTAID_X * NTID_X + TID_X;
    if (jl >= rp.width) return;
    u32 p = pass_pixels[rp.pixel0 + jl];
    u32 ps = 4u * p;
    if (rp.float_lanes != 0u) {
        Acc s = acc_load(pattern_sum + ps);
        u32 top = pattern_max[2u * p];
        u32 any_nan = pattern_max[2u * p + 1u];
        for (u32 t = 0; t < rp.m; t++) {
            float v = float_value(rp, scratch, background, jl, p, t);
            u32 bits = as_bits(v);
            if (is_nan_bits(bits)) any_nan = 1u;
            else if (order_key(bits) > order_key(top)) top = bits;
            acc_add(s, v, rp.one);
        }
        acc_store(pattern_sum + ps, s);
        pattern_max[2u * p] = top;
        pattern_max[2u * p + 1u] = any_nan;
    } else {
        u32 s = 0u, top = pattern_max[2u * p];
        for (u32 t = 0; t < rp.m; t++) {
            u32 v = scratch[jl * rp.m + t];
            s += v;
            top = v > top ? v : top;
        }
        unsigned long long sum =
            ((unsigned long long)pattern_sum[ps] | ((unsigned long long)pattern_sum[ps + 1u] << 32)) + s;
        pattern_sum[ps] = (u32)sum;
        pattern_sum[ps + 1u] = (u32)(sum >> 32);
        pattern_max[2u * p] = top;
    }
}
