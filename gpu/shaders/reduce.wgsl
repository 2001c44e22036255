// Reductions of the decoded pass in `scratch` (stream-major, see
// decode.wgsl): per-frame weighted sums over pixel lists (masks, total,
// row and column moments) and per-pixel sum and maximum over frames.
//
// Every accumulator is 4 u32 words. Integer sources (counts, scaled codes)
// are summed exactly as u64 held in (lo, hi) u32 pairs with carry (words 2
// and 3 unused). Float sources use the CPU reference's rule step for step
// (src/reduce/neumaier.rs): (sum, compensation, units, special), Neumaier's
// compensation, whole multiples of 2^126 moved into `units` so no partial
// sum overflows, non-finite terms only flagged (1: +inf, 2: -inf, 4: NaN).
// The host turns a state into its float32 value (Neumaier::value).
//
// WGSL lets an implementation assume that no NaN or infinity occurs, so
// every decision about non-finite values is taken on the bit patterns, and
// the float state itself never holds one.

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
    // 1.0, unknown to the shader compiler: multiplying the running sum by
    // it keeps compilers that reassociate float arithmetic (lavapipe's LLVM
    // does) from simplifying the compensation (s - t) + x to 0.
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
// Per pixel: 4 words, (lo, hi, -, -) or a float state.
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

// A float accumulator (see the head of this file).
struct Acc {
    s: f32,
    c: f32,
    h: i32,
    special: u32,
}

fn unit() -> f32 {
    return bitcast<f32>(0x7e800000u); // 2^126
}

fn inv_unit() -> f32 {
    return bitcast<f32>(0x00800000u); // 2^-126
}

fn load_acc(w: vec4<u32>) -> Acc {
    return Acc(bitcast<f32>(w.x), bitcast<f32>(w.y), bitcast<i32>(w.z), w.w);
}

fn acc_words(a: Acc) -> vec4<u32> {
    return vec4<u32>(bitcast<u32>(a.s), bitcast<u32>(a.c), bitcast<u32>(a.h), a.special);
}

// Adds count q of 2^126 to the units, saturating as the CPU does.
fn add_units(h: i32, q: i32) -> i32 {
    return clamp(h + q, -1073741824, 1073741824);
}

// Neumaier step: adds v to the state.
fn acc_add(a: Acc, v: f32) -> Acc {
    var r = a;
    let b = bitcast<u32>(v);
    if (!is_finite_bits(b)) {
        if (is_nan_bits(b)) {
            r.special = r.special | 4u;
        } else if ((b & 0x80000000u) == 0u) {
            r.special = r.special | 1u;
        } else {
            r.special = r.special | 2u;
        }
        return r;
    }
    var x = v;
    var q = 0.0;
    if (abs(x) >= unit()) {
        q = trunc(x * inv_unit());
        x = x - q * unit();
    }
    let t = (r.s + x) * rp.one;
    if (abs(r.s) >= abs(x)) {
        r.c = r.c + ((r.s - t) + x);
    } else {
        r.c = r.c + ((x - t) + r.s);
    }
    var s = t;
    var q2 = 0.0;
    if (abs(s) >= unit()) {
        q2 = trunc(s * inv_unit());
        s = s - q2 * unit();
    }
    r.s = s;
    r.h = add_units(r.h, i32(q) + i32(q2));
    return r;
}

// Merges a partial state (of later terms) into the state.
fn acc_merge(a: Acc, part: Acc) -> Acc {
    var r = a;
    r.h = add_units(r.h, part.h);
    r.special = r.special | part.special;
    r = acc_add(r, part.s);
    return acc_add(r, part.c);
}

fn slot(prod: u32, seg: u32, t: u32) -> u32 {
    return 4u * ((prod * rp.segments + seg) * rp.m + t);
}

fn store_partial(at: u32, w: vec4<u32>) {
    partials[at] = w.x;
    partials[at + 1u] = w.y;
    partials[at + 2u] = w.z;
    partials[at + 3u] = w.w;
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
        var s0 = Acc(0.0, 0.0, 0, 0u);
        var s1 = s0;
        var s2 = s0;
        for (var k = a; k < b; k++) {
            let jl = lists[start + k];
            let p = pass_pixels[rp.pixel0 + jl];
            let v = float_value(jl, p, t);
            s0 = acc_add(s0, v);
            if (mode == 1u) {
                // Rounded products (`* rp.one`): never fused into the sum.
                s1 = acc_add(s1, (f32(p / rp.columns) * v) * rp.one);
                s2 = acc_add(s2, (f32(p % rp.columns) * v) * rp.one);
            }
        }
        store_partial(slot(prod, seg, t), acc_words(s0));
        if (mode == 1u) {
            store_partial(slot(prod + 1u, seg, t), acc_words(s1));
            store_partial(slot(prod + 2u, seg, t), acc_words(s2));
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
        store_partial(slot(prod, seg, t), vec4<u32>(s0, 0u, 0u));
        if (mode == 1u) {
            store_partial(slot(prod + 1u, seg, t), vec4<u32>(s1, 0u, 0u));
            store_partial(slot(prod + 2u, seg, t), vec4<u32>(s2, 0u, 0u));
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
    let at = 4u * (prod * rp.batch_frames + rp.frame0 + t);
    if (rp.float_lanes != 0u) {
        var s = load_acc(vec4<u32>(acc[at], acc[at + 1u], acc[at + 2u], acc[at + 3u]));
        for (var seg = 0u; seg < rp.segments; seg++) {
            let i = slot(prod, seg, t);
            s = acc_merge(s, load_acc(vec4<u32>(partials[i], partials[i + 1u], partials[i + 2u], partials[i + 3u])));
        }
        let w = acc_words(s);
        acc[at] = w.x;
        acc[at + 1u] = w.y;
        acc[at + 2u] = w.z;
        acc[at + 3u] = w.w;
    } else {
        var s = vec2<u32>(acc[at], acc[at + 1u]);
        for (var seg = 0u; seg < rp.segments; seg++) {
            let i = slot(prod, seg, t);
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
        let ps = 4u * p;
        var s = load_acc(vec4<u32>(pattern_sum[ps], pattern_sum[ps + 1u], pattern_sum[ps + 2u], pattern_sum[ps + 3u]));
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
            s = acc_add(s, v);
        }
        let w = acc_words(s);
        pattern_sum[ps] = w.x;
        pattern_sum[ps + 1u] = w.y;
        pattern_sum[ps + 2u] = w.z;
        pattern_sum[ps + 3u] = w.w;
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
        let ps = 4u * p;
        let sum = add_u64(vec2<u32>(pattern_sum[ps], pattern_sum[ps + 1u]), vec2<u32>(s, 0u));
        pattern_sum[ps] = sum.x;
        pattern_sum[ps + 1u] = sum.y;
        pattern_max[2u * p] = top;
    }
}
