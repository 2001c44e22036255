//! Writing `.qem` files (spec §2–§9).

mod rans;
pub mod stream;

/// How each count stream's model is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelChoice {
    /// Exactly the reference writer's heuristic (spec §7.2): byte-identical output.
    Reference,
    /// The smallest encoding among every form and all 64 rANS tables, never
    /// larger than the reference choice.
    #[default]
    Smallest,
}
