// Reductions of the decoded pass in `scratch` (stream-major, see
// decode.wgsl): per-frame weighted sums over pixel lists (masks, total,
// row and column moments) and per-pixel sum and maximum over frames.
//
// Integer sources (counts, scaled codes) are summed exactly as u64 held in
// (lo, hi) u32 pairs with carry. Float sources are summed in float32 with
// Kahan compensation; a state is (s, c), the sum being s (c is the running
// compensation, as in the CPU reference).
//
// WGSL lets an implementation assume that no NaN or infinity occurs, so
// every decision about non-finite values is taken on the bit patterns.

struct ReduceParams {
    m: u32,
    // The pass's pixels: pass_pixels[pixel0 .. pixel0 + width]; scratch
    // slot jl holds pixel pass_pixels[pixel0 + jl].
    pixel0: u32,
    width: u32,
    // Detector columns (for row/column weights).
    columns: u32,
    // 1: float32 lanes (two streams per pixel); 0: u16 values.
    float_lanes: u32,
    // 1: subtract background[p] from every float value.
    background: u32,
    products: u32,
    segments: u32,
    seg_len: u32,
    // Offset of this pass's product descriptors in `descs` (in u32).
    desc_base: u32,
    // Frame offset of this block in the batch accumulators.
    frame0: u32,
    batch_frames: u32,
    // 1.0, unknown to the shader compiler: multiplying the Kahan sum by it
    // keeps compilers that reassociate float arithmetic (lavapipe's LLVM
    // does) from simplifying the compensation (t - s) - y to 0.
    one: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> rp: ReduceParams;
@group(0) @binding(1) var<storage, read> scratch: array<u32>;
// Scratch slots, grouped per product.
@group(0) @binding(2) var<storage, read> lists: array<u32>;
// Per pass and product: list start, count, mode (see `segments`).
@group(0) @binding(3) var<storage, read> descs: array<u32>;
@group(0) @binding(4) var<storage, read_write> partials: array<u32>;
@group(0) @binding(5) var<storage, read_write> acc: array<u32>;
@group(0) @binding(6) var<storage, read> background: array<f32>;
// Per pixel: (lo, hi) or Kahan (s, c).
@group(0) @binding(7) var<storage, read_write> pattern_sum: array<u32>;
// Per pixel: integer maximum, or (float maximum bits, any-NaN flag).
@group(0) @binding(8) var<storage, read_write> pattern_max: array<u32>;
// The decoded pixels, pass after pass.
@group(0) @binding(9) var<storage, read> pass_pixels: array<u32>;

fn is_nan_bits(b: u32) -> bool {
    return (b & 0x7fffffffu) > 0x7f800000u;
}

fn is_finite_bits(b: u32) -> bool {
    return (b & 0x7f800000u) != 0x7f800000u;
}

// A key whose unsigned order is the float order of non-NaN values.
fn order_key(b: u32) -> u32 {
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// The stored value of pass-local pixel `jl` at frame `t`.
fn code(jl: u32, t: u32) -> u32 {
    return scratch[jl * rp.m + t];
}

// The float32 value (background subtracted) of slot `jl`, pixel `p`, at frame `t`.
fn float_value(jl: u32, p: u32, t: u32) -> f32 {
    let bits = scratch[2u * jl * rp.m + t] | (scratch[(2u * jl + 1u) * rp.m + t] << 16u);
    var f = bitcast<f32>(bits);
    if (rp.background != 0u) {
        f = f - background[p];
    }
    return f;
}

// (lo, hi) + a * b for a < 2^16, b < 2^32, exactly.
fn add_product(acc_in: vec2<u32>, a: u32, b: u32) -> vec2<u32> {
    let low = a * (b & 0xffffu);
    let high = a * (b >> 16u);
    // a * b = low + high * 2^16
    var lo = acc_in.x + low;
    var hi = acc_in.y + select(0u, 1u, lo < low);
    let shifted = high << 16u;
    let lo2 = lo + shifted;
    hi = hi + select(0u, 1u, lo2 < lo) + (high >> 16u);
    return vec2<u32>(lo2, hi);
}

fn add_u64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

// Kahan step: adds x to the state (s, c).
fn kahan(state: vec2<f32>, x: f32) -> vec2<f32> {
    let y = x - state.y;
    let t = (state.x + y) * rp.one;
    var c = (t - state.x) - y;
    if (!is_finite_bits(bitcast<u32>(t))) {
        // An infinite or NaN sum stays what plain summation gives; the
        // compensation of a non-finite sum is meaningless.
        c = 0.0;
    }
    return vec2<f32>(t, c);
}

// Merges a Kahan partial (ps, pc) into the state (s, c).
fn kahan_merge(state: vec2<f32>, part: vec2<f32>) -> vec2<f32> {
    return kahan(vec2<f32>(state.x, state.y + part.y), part.x);
}

fn slot(prod: u32, seg: u32, t: u32) -> u32 {
    return 2u * ((prod * rp.segments + seg) * rp.m + t);
}

// One invocation per (frame, segment, product): the sum of the segment's
// list entries at that frame. Mode 0: a plain sum (a mask). Mode 1: the
// moments, total, row and column at once into products prod..prod+2 (so
// the values are read once); mode 2: a product mode 1 fills.
@compute @workgroup_size(64)
fn segments(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    let seg = gid.y;
    let prod = gid.z;
    if (t >= rp.m) {
        return;
    }
    let d = rp.desc_base + 3u * prod;
    let start = descs[d];
    let count = descs[d + 1u];
    let mode = descs[d + 2u];
    if (mode == 2u) {
        return;
    }
    let a = min(seg * rp.seg_len, count);
    let b = min(a + rp.seg_len, count);
    if (rp.float_lanes != 0u) {
        var s0 = vec2<f32>(0.0, 0.0);
        var s1 = vec2<f32>(0.0, 0.0);
        var s2 = vec2<f32>(0.0, 0.0);
        for (var k = a; k < b; k++) {
            let jl = lists[start + k];
            let p = pass_pixels[rp.pixel0 + jl];
            let v = float_value(jl, p, t);
            s0 = kahan(s0, v);
            if (mode == 1u) {
                s1 = kahan(s1, f32(p / rp.columns) * v);
                s2 = kahan(s2, f32(p % rp.columns) * v);
            }
        }
        let dst = slot(prod, seg, t);
        partials[dst] = bitcast<u32>(s0.x);
        partials[dst + 1u] = bitcast<u32>(s0.y);
        if (mode == 1u) {
            let d1 = slot(prod + 1u, seg, t);
            partials[d1] = bitcast<u32>(s1.x);
            partials[d1 + 1u] = bitcast<u32>(s1.y);
            let d2 = slot(prod + 2u, seg, t);
            partials[d2] = bitcast<u32>(s2.x);
            partials[d2 + 1u] = bitcast<u32>(s2.y);
        }
    } else {
        var s0 = vec2<u32>(0u, 0u);
        var s1 = vec2<u32>(0u, 0u);
        var s2 = vec2<u32>(0u, 0u);
        for (var k = a; k < b; k++) {
            let jl = lists[start + k];
            let v = code(jl, t);
            s0 = add_u64(s0, vec2<u32>(v, 0u));
            if (mode == 1u) {
                let p = pass_pixels[rp.pixel0 + jl];
                s1 = add_product(s1, v, p / rp.columns);
                s2 = add_product(s2, v, p % rp.columns);
            }
        }
        let dst = slot(prod, seg, t);
        partials[dst] = s0.x;
        partials[dst + 1u] = s0.y;
        if (mode == 1u) {
            let d1 = slot(prod + 1u, seg, t);
            partials[d1] = s1.x;
            partials[d1 + 1u] = s1.y;
            let d2 = slot(prod + 2u, seg, t);
            partials[d2] = s2.x;
            partials[d2 + 1u] = s2.y;
        }
    }
}

// One invocation per (frame, product): adds the segments into the batch
// accumulator of that frame.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    let prod = gid.y;
    if (t >= rp.m) {
        return;
    }
    let at = 2u * (prod * rp.batch_frames + rp.frame0 + t);
    if (rp.float_lanes != 0u) {
        var s = vec2<f32>(bitcast<f32>(acc[at]), bitcast<f32>(acc[at + 1u]));
        for (var seg = 0u; seg < rp.segments; seg++) {
            let i = 2u * ((prod * rp.segments + seg) * rp.m + t);
            s = kahan_merge(s, vec2<f32>(bitcast<f32>(partials[i]), bitcast<f32>(partials[i + 1u])));
        }
        acc[at] = bitcast<u32>(s.x);
        acc[at + 1u] = bitcast<u32>(s.y);
    } else {
        var s = vec2<u32>(acc[at], acc[at + 1u]);
        for (var seg = 0u; seg < rp.segments; seg++) {
            let i = 2u * ((prod * rp.segments + seg) * rp.m + t);
            s = add_u64(s, vec2<u32>(partials[i], partials[i + 1u]));
        }
        acc[at] = s.x;
        acc[at + 1u] = s.y;
    }
}

// One invocation per pixel of the pass: sum and maximum over the block's
// frames, added to the pattern accumulators.
@compute @workgroup_size(64)
fn pattern(@builtin(global_invocation_id) gid: vec3<u32>) {
    let jl = gid.x;
    if (jl >= rp.width) {
        return;
    }
    let p = pass_pixels[rp.pixel0 + jl];
    if (rp.float_lanes != 0u) {
        var s = vec2<f32>(bitcast<f32>(pattern_sum[2u * p]), bitcast<f32>(pattern_sum[2u * p + 1u]));
        var top = pattern_max[2u * p];
        var any_nan = pattern_max[2u * p + 1u];
        for (var t = 0u; t < rp.m; t++) {
            let v = float_value(jl, p, t);
            let bits = bitcast<u32>(v);
            if (is_nan_bits(bits)) {
                any_nan = 1u;
            } else if (order_key(bits) > order_key(top)) {
                top = bits;
            }
            s = kahan(s, v);
        }
        pattern_sum[2u * p] = bitcast<u32>(s.x);
        pattern_sum[2u * p + 1u] = bitcast<u32>(s.y);
        pattern_max[2u * p] = top;
        pattern_max[2u * p + 1u] = any_nan;
    } else {
        var s = 0u;
        var top = pattern_max[2u * p];
        for (var t = 0u; t < rp.m; t++) {
            let v = code(jl, t);
            s += v;
            top = max(top, v);
        }
        let sum = add_u64(vec2<u32>(pattern_sum[2u * p], pattern_sum[2u * p + 1u]), vec2<u32>(s, 0u));
        pattern_sum[2u * p] = sum.x;
        pattern_sum[2u * p + 1u] = sum.y;
        pattern_max[2u * p] = top;
    }
}
