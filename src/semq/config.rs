//! The 13-byte codec config (spec section 2) and the sizes derived from it.

use super::error::{Result, Section, SemqError};

/// The encoding operator; the discriminant is the byte stored in a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    Orbit = 0,
    Phase = 1,
    Quant = 2,
}

impl Operator {
    pub fn from_byte(b: u8) -> Option<Operator> {
        match b {
            0 => Some(Operator::Orbit),
            1 => Some(Operator::Phase),
            2 => Some(Operator::Quant),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Operator::Orbit => "orbit",
            Operator::Phase => "phase",
            Operator::Quant => "quant",
        }
    }

    pub fn from_name(name: &str) -> Option<Operator> {
        match name {
            "orbit" => Some(Operator::Orbit),
            "phase" => Some(Operator::Phase),
            "quant" => Some(Operator::Quant),
            _ => None,
        }
    }

    /// Name of the operator's own parameter (`p1`).
    pub fn param_name(self) -> &'static str {
        match self {
            Operator::Orbit => "scale",
            Operator::Phase => "sectors",
            Operator::Quant => "bins",
        }
    }
}

/// Size of a config in bytes.
pub const CONFIG_LEN: usize = 13;
pub const MAX_DIM: u32 = 65536;
pub const MAX_ORBIT_SCALE: u32 = 1 << 30;
/// Number of orbit symbols (0, 1..9 positive, 10..18 negative).
pub const ORBIT_ALPHABET: u32 = 19;

/// A valid codec config. Construction always validates, so every value of
/// this type satisfies the rules of spec section 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    operator: Operator,
    dim: u32,
    param: u32,
    rule_revision: u32,
}

/// A violated config rule: the field number of spec section 2 and a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigFault {
    pub field: u64,
    pub message: &'static str,
}

impl ConfigFault {
    pub fn into_invalid_input(self) -> SemqError {
        SemqError::invalid_at(self.message, None, Some(self.field))
    }

    pub fn into_format_error(self) -> SemqError {
        SemqError::format(Section::Config, self.message)
    }
}

fn fault(field: u64, message: &'static str) -> ConfigFault {
    ConfigFault { field, message }
}

/// Applies the validity rules in the order of spec section 2; `operator`
/// is the raw byte so that an unknown operator is reported as field 0.
pub fn check_fields(
    operator: u8,
    dim: u32,
    param: u32,
    rule_revision: u32,
) -> Result<Config, ConfigFault> {
    let Some(op) = Operator::from_byte(operator) else {
        return Err(fault(
            0,
            "operator must be orbit (0), phase (1) or quant (2)",
        ));
    };
    if !(1..=MAX_DIM).contains(&dim) {
        return Err(fault(1, "dim must be in [1, 65536]"));
    }
    if rule_revision != 0 {
        return Err(fault(3, "unknown rule revision"));
    }
    match op {
        Operator::Orbit => {
            if !(1..=MAX_ORBIT_SCALE).contains(&param) {
                return Err(fault(2, "scale must be in [1, 2^30]"));
            }
        }
        Operator::Phase => {
            if !(2..=256).contains(&param) {
                return Err(fault(2, "sectors must be in [2, 256]"));
            }
            if !dim.is_multiple_of(2) {
                return Err(fault(1, "phase needs an even dim"));
            }
            if param <= 16 && !dim.is_multiple_of(4) {
                return Err(fault(
                    1,
                    "phase with sectors <= 16 needs dim divisible by 4",
                ));
            }
        }
        Operator::Quant => {
            if !(2..=64).contains(&param) {
                return Err(fault(2, "bins must be in [2, 64]"));
            }
        }
    }
    Ok(Config {
        operator: op,
        dim,
        param,
        rule_revision,
    })
}

impl Config {
    /// A config with rule revision 0; InvalidInput with `field` when invalid.
    pub fn new(operator: Operator, dim: u32, param: u32) -> Result<Config> {
        check_fields(operator as u8, dim, param, 0).map_err(ConfigFault::into_invalid_input)
    }

    pub fn quant(dim: u32, bins: u32) -> Result<Config> {
        Config::new(Operator::Quant, dim, bins)
    }

    pub fn phase(dim: u32, sectors: u32) -> Result<Config> {
        Config::new(Operator::Phase, dim, sectors)
    }

    pub fn orbit(dim: u32, scale: u32) -> Result<Config> {
        Config::new(Operator::Orbit, dim, scale)
    }

    /// Parses and validates the 13 bytes; the fault says which rule failed.
    pub fn from_bytes(bytes: &[u8; CONFIG_LEN]) -> Result<Config, ConfigFault> {
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        check_fields(bytes[0], u32_at(1), u32_at(5), u32_at(9))
    }

    pub fn to_bytes(&self) -> [u8; CONFIG_LEN] {
        let mut out = [0u8; CONFIG_LEN];
        out[0] = self.operator as u8;
        out[1..5].copy_from_slice(&self.dim.to_le_bytes());
        out[5..9].copy_from_slice(&self.param.to_le_bytes());
        out[9..13].copy_from_slice(&self.rule_revision.to_le_bytes());
        out
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    pub fn dim(&self) -> u32 {
        self.dim
    }

    /// `p1`: scale (orbit), sectors (phase) or bins (quant).
    pub fn param(&self) -> u32 {
        self.param
    }

    pub fn rule_revision(&self) -> u32 {
        self.rule_revision
    }

    pub fn units_per_row(&self) -> usize {
        match self.operator {
            Operator::Phase => self.dim as usize / 2,
            Operator::Orbit | Operator::Quant => self.dim as usize,
        }
    }

    /// Number of symbol values; symbols are `0..alphabet`.
    pub fn alphabet(&self) -> u32 {
        match self.operator {
            Operator::Orbit => ORBIT_ALPHABET,
            Operator::Phase => self.param,
            Operator::Quant => 2 * self.param,
        }
    }

    pub fn bits_per_unit(&self) -> u32 {
        match self.operator {
            Operator::Orbit => 8,
            Operator::Phase if self.param <= 16 => 4,
            Operator::Phase => 8,
            // The bit length of 2·bins − 1.
            Operator::Quant => 32 - (2 * self.param - 1).leading_zeros(),
        }
    }

    pub fn bytes_per_vector(&self) -> usize {
        let dim = self.dim as usize;
        match self.operator {
            Operator::Orbit => dim,
            Operator::Phase if self.param <= 16 => dim / 4,
            Operator::Phase => dim / 2,
            Operator::Quant => (dim * self.bits_per_unit() as usize).div_ceil(8),
        }
    }

    /// Quant `M`: 2/sqrt(dim) in binary64, rounded once to binary32.
    pub fn max_magnitude(&self) -> f32 {
        (2.0f64 / f64::from(self.dim).sqrt()) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_magnitude_matches_the_spec_examples() {
        let cases = [
            (1, 0x4000_0000u32),
            (2, 0x3fb5_04f3),
            (4, 0x3f80_0000),
            (6, 0x3f51_05ec),
            (64, 0x3e80_0000),
            (384, 0x3dd1_05ec),
            (768, 0x3d93_cd3a),
            (1024, 0x3d80_0000),
            (4096, 0x3d00_0000),
            (65536, 0x3c00_0000),
        ];
        for (dim, bits) in cases {
            let c = Config::quant(dim, 4).unwrap();
            assert_eq!(c.max_magnitude().to_bits(), bits, "dim {dim}");
        }
    }

    #[test]
    fn quant_bits_per_unit_by_bins() {
        for (bins, bits) in [
            (2, 2),
            (3, 3),
            (4, 3),
            (5, 4),
            (8, 4),
            (9, 5),
            (16, 5),
            (17, 6),
            (32, 6),
            (33, 7),
            (64, 7),
        ] {
            assert_eq!(
                Config::quant(8, bins).unwrap().bits_per_unit(),
                bits,
                "bins {bins}"
            );
        }
    }

    #[test]
    fn example_bytes() {
        let c = Config::quant(4, 4).unwrap();
        assert_eq!(c.to_bytes(), [2, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Config::from_bytes(&c.to_bytes()), Ok(c));
    }

    #[test]
    fn validity_order_and_fields() {
        assert_eq!(check_fields(3, 0, 0, 1).unwrap_err().field, 0);
        assert_eq!(check_fields(2, 0, 0, 1).unwrap_err().field, 1);
        assert_eq!(check_fields(2, 65537, 4, 0).unwrap_err().field, 1);
        assert_eq!(check_fields(2, 4, 1, 1).unwrap_err().field, 3);
        assert_eq!(check_fields(2, 4, 65, 0).unwrap_err().field, 2);
        assert_eq!(check_fields(1, 3, 1, 0).unwrap_err().field, 2);
        assert_eq!(check_fields(1, 3, 17, 0).unwrap_err().field, 1);
        assert_eq!(check_fields(1, 6, 16, 0).unwrap_err().field, 1);
        assert!(check_fields(1, 6, 17, 0).is_ok());
        assert_eq!(check_fields(0, 4, 0, 0).unwrap_err().field, 2);
        assert_eq!(check_fields(0, 4, (1 << 30) + 1, 0).unwrap_err().field, 2);
        assert!(check_fields(0, 4, 1 << 30, 0).is_ok());
    }
}
