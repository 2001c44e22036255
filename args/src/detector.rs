//! The detector-geometry flags shared by `qem ls`/`qem cat` and
//! `qemfs mount` (one definition, so help, man pages and parsing agree).

use clap::Args;
use qemfs::reduce::geometry::{DetectorOptions, Edges};

/// Geometry of the `virtual/` detector images, in detector pixels. What is
/// not given is found in the data (see `virtual/detectors.json`).
#[derive(Debug, Clone, Default, PartialEq, Args, serde::Serialize, serde::Deserialize)]
pub struct DetectorArgs {
    /// Centre of the bright-field disk, "ROW,COLUMN" (default: found)
    #[arg(long, value_name = "ROW,COLUMN", value_parser = parse_pair)]
    pub center: Option<[f64; 2]>,
    /// Radius of the bright-field disk (default: found)
    #[arg(long, value_name = "R", value_parser = parse_radius)]
    pub bf_radius: Option<f64>,
    /// Annular bright field "INNER,OUTER" (default: R/2,R)
    #[arg(long, value_name = "INNER,OUTER", value_parser = parse_annulus)]
    pub abf: Option<[f64; 2]>,
    /// Annular dark field "INNER,OUTER" (default: 1.2R,min(3R,(1.2R+D)/2))
    #[arg(long, value_name = "INNER,OUTER", value_parser = parse_annulus)]
    pub adf: Option<[f64; 2]>,
    /// High-angle annular dark field "INNER,OUTER" (default: the ADF outer radius to the farthest pixel)
    #[arg(long, value_name = "INNER,OUTER", value_parser = parse_annulus)]
    pub haadf: Option<[f64; 2]>,
    /// Which mask edges count: inclusive (both, the default), libertem (the
    /// inner edge excluded) or py4dstem (both excluded), to reproduce those
    /// tools' images; a centre within 1e-9 pixels of an edge is on it
    #[arg(long, value_name = "RULE", default_value = "inclusive")]
    pub mask_edges: Edges,
    /// Index products (virtual/sum.npy, tile-aligned parts of detector
    /// images) decode and check every block they use against its spatial
    /// index first (default: checked whenever a block is decoded)
    #[arg(long)]
    #[serde(default)]
    pub verify_index: bool,
}

impl DetectorArgs {
    pub fn options(&self) -> DetectorOptions {
        let mut options = DetectorOptions::default();
        options.center = self.center;
        options.bf_radius = self.bf_radius;
        options.abf = self.abf;
        options.adf = self.adf;
        options.haadf = self.haadf;
        options.edges = self.mask_edges;
        options.verify_index = self.verify_index;
        options
    }
}

fn parse_radius(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{text:?} must be a finite number >= 0"))
    }
}

fn parse_pair(text: &str) -> Result<[f64; 2], String> {
    let (a, b) = text
        .split_once(',')
        .ok_or_else(|| format!("{text:?} is not two numbers separated by a comma"))?;
    Ok([parse_radius(a)?, parse_radius(b)?])
}

fn parse_annulus(text: &str) -> Result<[f64; 2], String> {
    let [inner, outer] = parse_pair(text)?;
    if inner > outer {
        return Err(format!("{text:?}: the inner radius exceeds the outer"));
    }
    Ok([inner, outer])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_round_trip() {
        assert_eq!(parse_pair("63.5, 64"), Ok([63.5, 64.0]));
        assert!(parse_pair("1").is_err());
        assert!(parse_pair("-1,2").is_err());
        assert!(parse_radius("nan").is_err());
        assert!(parse_radius("inf").is_err());
        assert!(parse_annulus("5,4").is_err());
        let args = DetectorArgs {
            center: Some([1.5, 2.0]),
            bf_radius: Some(3.25),
            abf: None,
            adf: Some([4.0, 9.0]),
            haadf: None,
            mask_edges: Edges::Libertem,
            verify_index: true,
        };
        // The daemon gets its flags as one JSON value.
        let json = serde_json::to_string(&args).unwrap();
        assert_eq!(serde_json::from_str::<DetectorArgs>(&json).unwrap(), args);
        assert!(json.contains("\"libertem\""), "{json}");
    }
}
