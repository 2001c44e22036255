// Count-stream decoding (spec §7): one invocation decodes one stream of the
// pass into `scratch`, stream-major (`m` values per stream, one u32 each),
// exactly as src/qem/stream.rs and src/qem/rans.rs do on the CPU. A stream
// that cannot be decoded appends a fault record (block, pass, stream, code, a, b)
// that the host turns into the same QemError the CPU decoder reports; the
// values it leaves in `scratch` are never used.

struct DecodeParams {
    // Streams in this pass.
    streams: u32,
    // Values per stream.
    m: u32,
    // Chunk-payload byte offset of payload word 0 (a multiple of 4).
    byte_base: u32,
    // 1 for uint8 files: a value above 255 is a fault.
    u8_limit: u32,
    // Global block index and pass index in its plan, for fault records.
    block: u32,
    pass_index: u32,
    pad0: u32,
    pad1: u32,
}

const MAX_FAULTS: u32 = 64u;

// Fault codes (mirrored in src/wgpu_backend.rs).
const FAULT_SELECTOR: u32 = 1u;
const FAULT_LENGTH: u32 = 2u;
const FAULT_INITIAL_STATE: u32 = 3u;
const FAULT_TRUNCATED: u32 = 4u;
const FAULT_TRUNCATED_ESCAPE: u32 = 5u;
const FAULT_FINAL_STATE: u32 = 6u;
const FAULT_SPARSE_POSITION: u32 = 7u;
const FAULT_VALUE_RANGE: u32 = 8u;

struct Faults {
    count: atomic<u32>,
    // (block, pass, stream in pass, code, a, b) per record.
    records: array<u32, 384>,
}

@group(0) @binding(0) var<uniform> dp: DecodeParams;
@group(0) @binding(1) var<storage, read> payload: array<u32>;
// streams + 1 chunk-payload offsets.
@group(0) @binding(2) var<storage, read> offsets: array<u32>;
// One selector byte per stream, 4 to a word.
@group(0) @binding(3) var<storage, read> selectors: array<u32>;
// 64 tables x 1024 slots: bits 0..10 slot - start, 10..16 symbol, 16..27 frequency.
@group(0) @binding(4) var<storage, read> slots: array<u32>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(6) var<storage, read_write> faults: Faults;

const STATE_LOWER: u32 = 0x800000u;
const STATE_UPPER: u32 = 0x80000000u;

fn byte_at(i: u32) -> u32 {
    return (payload[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn word_at(i: u32) -> u32 {
    return byte_at(i) | (byte_at(i + 1u) << 8u);
}

fn fault(j: u32, code: u32, a: u32, b: u32) {
    let k = atomicAdd(&faults.count, 1u);
    if (k < MAX_FAULTS) {
        let r = 6u * k;
        faults.records[r] = dp.block;
        faults.records[r + 1u] = dp.pass_index;
        faults.records[r + 2u] = j;
        faults.records[r + 3u] = code;
        faults.records[r + 4u] = a;
        faults.records[r + 5u] = b;
    }
}

@compute @workgroup_size(64)
fn decode(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    if (j >= dp.streams) {
        return;
    }
    let m = dp.m;
    let out0 = j * m;
    let sel = (selectors[j >> 2u] >> ((j & 3u) * 8u)) & 0xffu;
    let start = offsets[j] - dp.byte_base;
    let end = offsets[j + 1u] - dp.byte_base;
    let len = end - start;
    // The first value above the uint8 range, if any.
    var over = false;
    var over_value = 0u;

    if (sel == 253u) {
        // zeros
        if (len != 0u) {
            fault(j, FAULT_LENGTH, sel, len);
            return;
        }
        for (var t = 0u; t < m; t++) {
            scratch[out0 + t] = 0u;
        }
    } else if (sel == 255u) {
        // constant
        if (len != 2u) {
            fault(j, FAULT_LENGTH, sel, len);
            return;
        }
        let v = word_at(start);
        for (var t = 0u; t < m; t++) {
            scratch[out0 + t] = v;
        }
        if (v > 255u) {
            over = true;
            over_value = v;
        }
    } else if (sel == 254u) {
        // literal
        if (len != 2u * m) {
            fault(j, FAULT_LENGTH, sel, len);
            return;
        }
        for (var t = 0u; t < m; t++) {
            let v = word_at(start + 2u * t);
            scratch[out0 + t] = v;
            if (v > 255u && !over) {
                over = true;
                over_value = v;
            }
        }
    } else if (sel == 252u) {
        // sparse events: position e >> 7, value (e & 127) + 1
        if ((len & 1u) != 0u) {
            fault(j, FAULT_LENGTH, sel, len);
            return;
        }
        for (var t = 0u; t < m; t++) {
            scratch[out0 + t] = 0u;
        }
        var next = 0u;
        for (var k = 0u; k < len / 2u; k++) {
            let e = word_at(start + 2u * k);
            let position = e >> 7u;
            if (position < next || position >= m) {
                fault(j, FAULT_SPARSE_POSITION, position, 0u);
                return;
            }
            scratch[out0 + position] = (e & 127u) + 1u;
            next = position + 1u;
        }
    } else if (sel < 64u) {
        // rANS with table `sel` (spec §7.1)
        if (len < 4u) {
            fault(j, FAULT_LENGTH, sel, len);
            return;
        }
        var x = byte_at(start) | (byte_at(start + 1u) << 8u) | (byte_at(start + 2u) << 16u)
            | (byte_at(start + 3u) << 24u);
        if (x < STATE_LOWER || x >= STATE_UPPER) {
            fault(j, FAULT_INITIAL_STATE, x, 0u);
            return;
        }
        var i = start + 4u;
        let table = sel * 1024u;
        for (var t = 0u; t < m; t++) {
            let e = slots[table + (x & 1023u)];
            x = (e >> 16u) * (x >> 10u) + (e & 1023u);
            while (x < STATE_LOWER) {
                if (i >= end) {
                    fault(j, FAULT_TRUNCATED, 0u, 0u);
                    return;
                }
                x = (x << 8u) | byte_at(i);
                i += 1u;
            }
            var v = (e >> 10u) & 63u;
            if (v == 32u) {
                // escape: the value follows as a little-endian u16
                if (i + 2u > end) {
                    fault(j, FAULT_TRUNCATED_ESCAPE, 0u, 0u);
                    return;
                }
                v = word_at(i);
                i += 2u;
            }
            scratch[out0 + t] = v;
            if (v > 255u && !over) {
                over = true;
                over_value = v;
            }
        }
        if (x != STATE_LOWER || i != end) {
            fault(j, FAULT_FINAL_STATE, x, end - i);
            return;
        }
    } else {
        fault(j, FAULT_SELECTOR, sel, 0u);
        return;
    }
    if (over && dp.u8_limit != 0u) {
        fault(j, FAULT_VALUE_RANGE, over_value, 0u);
    }
}
