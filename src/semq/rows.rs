//! Packing of symbols into rows and the canonical-row rule (spec 3.2).
//!
//! Symbols travel as one byte per unit: every alphabet fits (quant ≤ 128,
//! phase ≤ 256, orbit 19).

use super::config::{Config, Operator};

/// Where a row breaks the canonical rule: the first unit whose symbol is
/// outside the alphabet, or `None` when only a padding bit is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowFault {
    pub unit: Option<usize>,
}

/// Writes the packed form of `symbols` (units_per_row values, each inside
/// the alphabet) into `out` (bytes_per_vector bytes), padding with zeros.
pub fn pack(config: &Config, symbols: &[u8], out: &mut [u8]) {
    match config.operator() {
        Operator::Orbit => out.copy_from_slice(symbols),
        Operator::Phase if config.param() <= 16 => {
            for (byte, pair) in out.iter_mut().zip(symbols.chunks_exact(2)) {
                *byte = (pair[0] & 0x0f) | (pair[1] << 4);
            }
        }
        Operator::Phase => out.copy_from_slice(symbols),
        Operator::Quant => pack_quant(config.bits_per_unit() as usize, symbols, out),
    }
}

/// Eight b-bit symbols fill exactly b bytes, so whole groups of eight are
/// packed without branches; the tail goes through the general stream.
fn pack_quant(bits: usize, symbols: &[u8], out: &mut [u8]) {
    let groups = symbols.len() / 8;
    for (group, dst) in symbols.chunks_exact(8).zip(out.chunks_exact_mut(bits)) {
        let mut acc: u64 = 0;
        for (k, &s) in group.iter().enumerate() {
            acc |= u64::from(s) << (k * bits);
        }
        dst.copy_from_slice(&acc.to_le_bytes()[..bits]);
    }
    let done = groups * bits;
    if let (Some(rest_in), Some(rest_out)) = (symbols.get(groups * 8..), out.get_mut(done..)) {
        pack_bits(bits as u32, rest_in, rest_out);
    }
}

/// Little-endian bit stream, least significant bit of each symbol first.
fn pack_bits(bits: u32, symbols: &[u8], out: &mut [u8]) {
    let mut acc: u64 = 0;
    let mut held: u32 = 0;
    let mut pos = 0usize;
    for &s in symbols {
        acc |= u64::from(s) << held;
        held += bits;
        while held >= 8 {
            if let Some(b) = out.get_mut(pos) {
                *b = acc as u8;
            }
            pos += 1;
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        if let Some(b) = out.get_mut(pos) {
            *b = acc as u8;
        }
        pos += 1;
    }
    for b in out.iter_mut().skip(pos) {
        *b = 0;
    }
}

/// Reads units_per_row symbols from a row of bytes_per_vector bytes.
pub fn unpack(config: &Config, row: &[u8], out: &mut [u8]) {
    match config.operator() {
        Operator::Orbit => out.copy_from_slice(row),
        Operator::Phase if config.param() <= 16 => {
            for (pair, &byte) in out.chunks_exact_mut(2).zip(row) {
                pair[0] = byte & 0x0f;
                pair[1] = byte >> 4;
            }
        }
        Operator::Phase => out.copy_from_slice(row),
        Operator::Quant => unpack_bits(config.bits_per_unit(), row, out),
    }
}

fn unpack_bits(bits: u32, row: &[u8], out: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    let mut acc: u64 = 0;
    let mut held: u32 = 0;
    let mut bytes = row.iter();
    for s in out.iter_mut() {
        while held < bits {
            acc |= u64::from(bytes.next().copied().unwrap_or(0)) << held;
            held += 8;
        }
        *s = (acc & mask) as u8;
        acc >>= bits;
        held -= bits;
    }
}

/// The symbol of one unit of a row (`unit` < units_per_row); the tests'
/// reference for the packed layout.
#[cfg(test)]
pub(crate) fn symbol_at(config: &Config, row: &[u8], unit: usize) -> u8 {
    match config.operator() {
        Operator::Orbit => row.get(unit).copied().unwrap_or(0),
        Operator::Phase if config.param() <= 16 => {
            let byte = row.get(unit / 2).copied().unwrap_or(0);
            if unit.is_multiple_of(2) {
                byte & 0x0f
            } else {
                byte >> 4
            }
        }
        Operator::Phase => row.get(unit).copied().unwrap_or(0),
        Operator::Quant => {
            let bits = config.bits_per_unit() as usize;
            let start = unit * bits;
            let mut v: u32 = 0;
            for k in 0..bits {
                let bit = start + k;
                let byte = row.get(bit / 8).copied().unwrap_or(0);
                v |= u32::from((byte >> (bit % 8)) & 1) << k;
            }
            v as u8
        }
    }
}

/// False when every bit pattern of a row is canonical (phase with 16 or
/// 256 sectors, quant with a power-of-two alphabet and no padding).
pub(crate) fn can_be_non_canonical(config: &Config) -> bool {
    match config.operator() {
        Operator::Orbit => true,
        Operator::Phase => config.param() != 16 && config.param() != 256,
        Operator::Quant => {
            let bits = config.bits_per_unit();
            config.alphabet() != 1 << bits
                || !(config.units_per_row() * bits as usize).is_multiple_of(8)
        }
    }
}

/// Checks the canonical rule: every symbol inside the alphabet, every
/// padding bit zero. The common power-of-two alphabets only need the
/// padding test, which keeps full-file verification cheap.
pub(crate) fn check_canonical(config: &Config, row: &[u8]) -> Result<(), RowFault> {
    let alphabet = config.alphabet();
    match config.operator() {
        // The common case (canonical) is decided by a branch-free maximum,
        // which vectorizes; the offending unit is searched only on failure.
        Operator::Orbit => {
            if u32::from(row.iter().fold(0u8, |m, &b| m.max(b))) < alphabet {
                return Ok(());
            }
            Err(RowFault {
                unit: row.iter().position(|&b| u32::from(b) >= alphabet),
            })
        }
        Operator::Phase if config.param() <= 16 => {
            if alphabet == 16 {
                return Ok(());
            }
            let (lo, hi) = row.iter().fold((0u8, 0u8), |(lo, hi), &b| {
                (lo.max(b & 0x0f), hi.max(b >> 4))
            });
            if u32::from(lo.max(hi)) < alphabet {
                return Ok(());
            }
            let unit = row.iter().enumerate().find_map(|(i, &byte)| {
                if u32::from(byte & 0x0f) >= alphabet {
                    Some(2 * i)
                } else if u32::from(byte >> 4) >= alphabet {
                    Some(2 * i + 1)
                } else {
                    None
                }
            });
            Err(RowFault { unit })
        }
        Operator::Phase => {
            if alphabet == 256 || u32::from(row.iter().fold(0u8, |m, &b| m.max(b))) < alphabet {
                return Ok(());
            }
            Err(RowFault {
                unit: row.iter().position(|&b| u32::from(b) >= alphabet),
            })
        }
        Operator::Quant => {
            let bits = config.bits_per_unit();
            if alphabet != 1 << bits {
                let mask = (1u64 << bits) - 1;
                let mut acc: u64 = 0;
                let mut held: u32 = 0;
                let mut bytes = row.iter();
                for unit in 0..config.units_per_row() {
                    while held < bits {
                        acc |= u64::from(bytes.next().copied().unwrap_or(0)) << held;
                        held += 8;
                    }
                    if (acc & mask) as u32 >= alphabet {
                        return Err(RowFault { unit: Some(unit) });
                    }
                    acc >>= bits;
                    held -= bits;
                }
            }
            let used_bits = config.units_per_row() * bits as usize;
            let pad = row.len() * 8 - used_bits;
            if pad > 0 {
                let last = row.last().copied().unwrap_or(0);
                if last >> (8 - pad) != 0 {
                    return Err(RowFault { unit: None });
                }
            }
            Ok(())
        }
    }
}

/// Number of units whose symbol differs between two rows of one config.
pub fn hamming(config: &Config, a: &[u8], b: &[u8]) -> u64 {
    let differing_bytes = || a.iter().zip(b).filter(|(x, y)| x != y).count() as u64;
    match config.operator() {
        Operator::Orbit => differing_bytes(),
        Operator::Phase if config.param() <= 16 => a
            .iter()
            .zip(b)
            .map(|(x, y)| {
                let d = x ^ y;
                u64::from(d & 0x0f != 0) + u64::from(d & 0xf0 != 0)
            })
            .sum(),
        Operator::Phase => differing_bytes(),
        Operator::Quant => {
            // Walk both bit streams in step; XOR marks differing bits, and a
            // unit counts once however many of its bits differ.
            let bits = config.bits_per_unit();
            let mask = (1u64 << bits) - 1;
            let (mut acc, mut held, mut count) = (0u64, 0u32, 0u64);
            let mut bytes = a.iter().zip(b).map(|(x, y)| x ^ y);
            for _ in 0..config.units_per_row() {
                while held < bits {
                    acc |= u64::from(bytes.next().unwrap_or(0)) << held;
                    held += 8;
                }
                count += u64::from(acc & mask != 0);
                acc >>= bits;
                held -= bits;
            }
            count
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_quant_row() {
        let c = Config::quant(4, 4).unwrap();
        let mut row = [0u8; 2];
        pack(&c, &[7, 0, 4, 3], &mut row);
        assert_eq!(row, [0x07, 0x07]);
        let mut back = [0u8; 4];
        unpack(&c, &row, &mut back);
        assert_eq!(back, [7, 0, 4, 3]);
        for (i, s) in back.iter().enumerate() {
            assert_eq!(symbol_at(&c, &row, i), *s);
        }
        assert_eq!(check_canonical(&c, &row), Ok(()));
        assert_eq!(
            check_canonical(&c, &[0x07, 0x17]),
            Err(RowFault { unit: None })
        );
    }

    #[test]
    fn non_power_of_two_alphabet() {
        let c = Config::quant(4, 3).unwrap();
        let mut row = [0u8; 2];
        pack(&c, &[5, 0, 6, 1], &mut row);
        assert_eq!(check_canonical(&c, &row), Err(RowFault { unit: Some(2) }));
    }

    #[test]
    fn phase_nibbles_and_hamming() {
        let c = Config::phase(8, 12).unwrap();
        let mut a = [0u8; 2];
        let mut b = [0u8; 2];
        pack(&c, &[1, 2, 3, 4], &mut a);
        pack(&c, &[2, 3, 3, 5], &mut b);
        assert_eq!(a, [0x21, 0x43]);
        assert_eq!(hamming(&c, &a, &b), 3);
        assert_eq!(
            check_canonical(&c, &[0xc0, 0x00]),
            Err(RowFault { unit: Some(1) })
        );
    }

    #[test]
    fn quant_symbol_spanning_two_bytes_counts_once() {
        let c = Config::quant(4, 4).unwrap();
        let mut a = [0u8; 2];
        let mut b = [0u8; 2];
        pack(&c, &[0, 0, 7, 0], &mut a);
        pack(&c, &[0, 0, 0, 0], &mut b);
        assert_eq!(hamming(&c, &a, &b), 1);
    }
}
