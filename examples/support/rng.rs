//! The seeded generator of the bundled examples (`examples/make_examples.rs`)
//! and of the benchmarks' synthetic inputs (`benches/*.rs`), which include
//! this file with `#[path]`. xorshift64*: small and deterministic, so the
//! example files never change; its values must stay as they are.

// Each includer uses a part of it.
#![allow(dead_code)]

use std::f64::consts::PI;

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Poisson by Knuth's product of uniforms (fine for the small means
    /// used here).
    pub fn poisson(&mut self, mean: f64) -> u16 {
        let limit = (-mean).exp();
        let (mut k, mut p) = (0u16, self.uniform());
        while p > limit && k < u16::MAX {
            k += 1;
            p *= self.uniform();
        }
        k
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-12), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * PI * v).cos()
    }

    /// Roughly normal and cheap: four 16-bit uniforms summed, centred.
    pub fn gauss(&mut self) -> f64 {
        let x = self.next();
        let parts = [
            (x & 0xffff),
            ((x >> 16) & 0xffff),
            ((x >> 32) & 0xffff),
            (x >> 48),
        ];
        parts.iter().map(|&p| p as f64 / 65536.0).sum::<f64>() - 2.0
    }
}
