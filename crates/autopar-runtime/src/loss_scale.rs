//! Loss scaling (MindSpore's `FixedLossScaleManager` and `DynamicLossScaleManager`): the
//! backward pass is seeded with the loss times a scale, so that small gradients of low-precision
//! activations do not underflow; the gradients are multiplied by the scale's reciprocal before
//! they are synchronised; a step whose gradients overflowed on any rank (an infinity or NaN
//! anywhere) is skipped by every rank, and a dynamic scale is lowered.
//!
//! [`LossScale`] is the choice, [`LossScaler`] the running state and its update rule (MindSpore's
//! `DynamicLossScaleUpdateCell`), [`LossScaleState`] what a checkpoint keeps of it.

use std::fmt;
use std::str::FromStr;

use crate::error::{Result, RuntimeError};

/// How the loss is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum LossScale {
    /// No scaling: the seed is the loss's own, no overflow check.
    #[default]
    None,
    /// A constant scale; a step whose gradients overflow is skipped when `drop_overflow_update`
    /// (MindSpore's default), else applied as it is.
    Fixed {
        /// The scale.
        scale: f64,
        /// Skip the update of a step whose gradients overflowed.
        drop_overflow_update: bool,
    },
    /// A scale divided by `factor` (not below 1) at each overflow, and multiplied by it after
    /// `window` steps in a row without one.
    Dynamic {
        /// The first step's scale (MindSpore's default 2^24).
        init: f64,
        /// The factor (MindSpore's default 2).
        factor: f64,
        /// Steps without overflow before the scale grows (MindSpore's default 2000).
        window: u64,
    },
}

impl LossScale {
    /// MindSpore's `DynamicLossScaleManager()` defaults.
    pub const DYNAMIC: LossScale = LossScale::Dynamic { init: 16_777_216.0, factor: 2.0, window: 2000 };

    /// Whether the loss is scaled at all.
    pub fn is_on(&self) -> bool {
        *self != LossScale::None
    }

    /// Checks the values: a finite scale above 0 (a dynamic one of at least 1), a factor above
    /// 1, a window of at least 1 step.
    pub fn check(&self) -> Result<()> {
        let problem = match *self {
            LossScale::Fixed { scale, .. } if !(scale.is_finite() && scale >= 1.0) => "the scale must be a finite value of 1 or more",
            LossScale::Dynamic { init, .. } if !(init.is_finite() && init >= 1.0) => "the first scale must be a finite value of 1 or more",
            LossScale::Dynamic { factor, .. } if !(factor.is_finite() && factor > 1.0) => "the factor must be a finite value above 1",
            LossScale::Dynamic { window: 0, .. } => "the window must be at least 1 step",
            _ => return Ok(()),
        };
        Err(RuntimeError::BadLossScale { scale: self.to_string(), problem: problem.into() })
    }
}

/// A scale as `--loss-scale` takes it back, shortest: `1024`, `0.5`, `1e60`.
pub fn scale_text(x: f64) -> String {
    if x.abs() < 1e16 {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

impl fmt::Display for LossScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LossScale::None => write!(f, "none"),
            LossScale::Fixed { scale, drop_overflow_update: true } => write!(f, "fixed:{}", scale_text(scale)),
            LossScale::Fixed { scale, drop_overflow_update: false } => write!(f, "fixed:{}:keep", scale_text(scale)),
            LossScale::Dynamic { init, factor, window } => write!(f, "dynamic:{}:{}:{window}", scale_text(init), scale_text(factor)),
        }
    }
}

/// What a loss-scale choice that does not parse says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("loss scale {given:?}: {problem} (the forms: none, fixed:S, fixed:S:keep, dynamic, dynamic:INIT, dynamic:INIT:FACTOR:WINDOW)")]
pub struct BadLossScale {
    /// The text given.
    pub given: String,
    /// What is wrong with it.
    pub problem: String,
}

impl FromStr for LossScale {
    type Err = BadLossScale;

    /// `none`, `fixed:S` (overflowed steps skipped), `fixed:S:keep` (applied anyway),
    /// `dynamic` (MindSpore's defaults), `dynamic:INIT` or `dynamic:INIT:FACTOR:WINDOW`.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let bad = |problem: String| BadLossScale { given: s.to_string(), problem };
        let num = |v: &str| v.trim().parse::<f64>().map_err(|_| bad(format!("{v:?} is not a number")));
        let parts: Vec<&str> = s.trim().split(':').collect();
        let scale = match parts.as_slice() {
            ["none"] => LossScale::None,
            ["fixed", v] => LossScale::Fixed { scale: num(v)?, drop_overflow_update: true },
            ["fixed", v, "keep"] => LossScale::Fixed { scale: num(v)?, drop_overflow_update: false },
            ["dynamic"] => LossScale::DYNAMIC,
            ["dynamic", init] => LossScale::Dynamic { init: num(init)?, factor: 2.0, window: 2000 },
            ["dynamic", init, factor, window] => LossScale::Dynamic {
                init: num(init)?,
                factor: num(factor)?,
                window: window.trim().parse().map_err(|_| bad(format!("window {window:?} is not a whole number of steps")))?,
            },
            _ => return Err(bad("not a form autopar knows".into())),
        };
        if let Err(RuntimeError::BadLossScale { problem, .. }) = scale.check() {
            return Err(bad(problem));
        }
        Ok(scale)
    }
}

/// What a checkpoint keeps of the loss scaling: the choice, the scale of the next step and the
/// last step that overflowed or grew the scale (MindSpore's `last_overflow_iterator_step`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaleState {
    /// The run's choice.
    pub kind: LossScale,
    /// The next step's scale.
    pub scale: f64,
    /// MindSpore's `last_overflow_iterator_step` (its iterations count from 1; at most the
    /// steps run).
    pub last_overflow_iter: u64,
}

/// What a step did under loss scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaledStep {
    /// The scale the step's backward pass was seeded with.
    pub scale: f64,
    /// Whether its gradients overflowed on some rank.
    pub overflow: bool,
    /// The next step's scale.
    pub next: f64,
}

/// The running loss scale and its update rule.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    kind: LossScale,
    state: LossScaleState,
    /// MindSpore's `current_iterator_step`: the step about to run, counted from 1.
    cur_iter: u64,
}

impl LossScaler {
    /// The scaler of a run starting at step 0; None without loss scaling.
    pub fn new(kind: LossScale) -> Result<Option<Self>> {
        kind.check()?;
        let scale = match kind {
            LossScale::None => return Ok(None),
            LossScale::Fixed { scale, .. } => scale,
            LossScale::Dynamic { init, .. } => init,
        };
        Ok(Some(Self { kind, state: LossScaleState { kind, scale, last_overflow_iter: 0 }, cur_iter: 1 }))
    }

    /// Continues a run after `steps` steps: from a checkpoint's state when it was written
    /// under the same choice; otherwise (a checkpoint without loss scaling, or under another
    /// choice) from this choice's first scale, its window counted from the resumed step.
    pub fn resume(&mut self, steps: u64, saved: Option<LossScaleState>) {
        self.state = match saved {
            Some(s) if s.kind == self.kind => LossScaleState { last_overflow_iter: s.last_overflow_iter.min(steps), ..s },
            _ => LossScaleState { last_overflow_iter: steps, ..self.state },
        };
        self.cur_iter = steps + 1;
    }

    /// The scale the next step seeds its backward pass with.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// What a checkpoint saves.
    pub fn state(&self) -> LossScaleState {
        self.state
    }

    /// Whether a step whose gradients overflowed is skipped.
    pub fn skips_overflow(&self) -> bool {
        !matches!(self.kind, LossScale::Fixed { drop_overflow_update: false, .. })
    }

    /// After a step: whether it overflowed (on any rank). Returns whether its update is applied.
    pub fn update(&mut self, overflow: bool) -> bool {
        if let LossScale::Dynamic { factor, window, .. } = self.kind {
            let s = &mut self.state;
            let on_overflow = if overflow { (s.scale / factor).max(1.0) } else { s.scale };
            let should_grow = self.cur_iter.saturating_sub(s.last_overflow_iter) >= window;
            if overflow || should_grow {
                s.last_overflow_iter = self.cur_iter;
            }
            s.scale = if should_grow && !overflow { on_overflow * factor } else { on_overflow };
        }
        self.cur_iter += 1;
        !(overflow && self.skips_overflow())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_form_and_refuses_the_rest() {
        assert_eq!("none".parse::<LossScale>().unwrap(), LossScale::None);
        assert_eq!("fixed:1024".parse::<LossScale>().unwrap(), LossScale::Fixed { scale: 1024.0, drop_overflow_update: true });
        assert_eq!("fixed:8:keep".parse::<LossScale>().unwrap(), LossScale::Fixed { scale: 8.0, drop_overflow_update: false });
        assert_eq!("dynamic".parse::<LossScale>().unwrap(), LossScale::DYNAMIC);
        assert_eq!("dynamic:65536".parse::<LossScale>().unwrap(), LossScale::Dynamic { init: 65536.0, factor: 2.0, window: 2000 });
        assert_eq!("dynamic:4:3:10".parse::<LossScale>().unwrap(), LossScale::Dynamic { init: 4.0, factor: 3.0, window: 10 });
        for bad in ["", "fixed", "fixed:x", "fixed:-1", "dynamic:0.5", "dynamic:4:1:10", "dynamic:4:2:0", "dynamic:4:2", "static:2"] {
            let err = bad.parse::<LossScale>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert_eq!(LossScale::Fixed { scale: 1e60, drop_overflow_update: true }.to_string(), "fixed:1e60");
        for s in [
            LossScale::None,
            LossScale::DYNAMIC,
            LossScale::Fixed { scale: 2.0, drop_overflow_update: false },
            LossScale::Dynamic { init: 0.1f64.powi(-40), factor: 1.0 + f64::EPSILON, window: 3 },
        ] {
            assert_eq!(s.to_string().parse::<LossScale>().unwrap(), s);
        }
    }

    /// MindSpore's `DynamicLossScaleUpdateCell`, step by step: a window of 2 from 8 with factor 2.
    #[test]
    fn dynamic_follows_mindspore_update_cell() {
        let mut s = LossScaler::new(LossScale::Dynamic { init: 8.0, factor: 2.0, window: 2 }).unwrap().unwrap();
        // iter 1: no overflow, 1 - 0 < 2; iter 2: 2 - 0 >= 2: grows, last = 2.
        let mut seen = Vec::new();
        for overflow in [false, false, true, false, false, false, true, true, true, true, true] {
            let applied = s.update(overflow);
            assert_eq!(applied, !overflow);
            seen.push(s.scale());
        }
        assert_eq!(seen, vec![8.0, 16.0, 8.0, 8.0, 16.0, 16.0, 8.0, 4.0, 2.0, 1.0, 1.0]);
    }

    #[test]
    fn fixed_skips_or_keeps_as_asked_and_never_changes() {
        let mut s = LossScaler::new(LossScale::Fixed { scale: 4.0, drop_overflow_update: true }).unwrap().unwrap();
        assert!(!s.update(true));
        assert!(s.update(false));
        assert_eq!(s.scale(), 4.0);
        let mut k = LossScaler::new(LossScale::Fixed { scale: 4.0, drop_overflow_update: false }).unwrap().unwrap();
        assert!(k.update(true));
        assert!(LossScaler::new(LossScale::None).unwrap().is_none());
    }

    /// A checkpoint of another choice (or none) starts this one afresh at the resumed step: its
    /// window counts from there.
    #[test]
    fn resuming_under_another_choice_starts_it_at_the_resumed_step() {
        let kind = LossScale::Dynamic { init: 8.0, factor: 2.0, window: 2 };
        let fixed = LossScaler::new(LossScale::Fixed { scale: 1024.0, drop_overflow_update: true }).unwrap().unwrap();
        for saved in [None, Some(fixed.state())] {
            let mut s = LossScaler::new(kind).unwrap().unwrap();
            s.resume(100, saved);
            assert_eq!(s.scale(), 8.0);
            s.update(false);
            assert_eq!(s.scale(), 8.0, "one step after the resume: the window of 2 is not full");
            s.update(false);
            assert_eq!(s.scale(), 16.0);
        }
    }

    proptest! {
        /// A resumed scaler continues exactly as the one that ran through.
        #[test]
        fn resuming_continues_the_same_sequence(flags in proptest::collection::vec(any::<bool>(), 1..40), cut in 0usize..40) {
            let kind = LossScale::Dynamic { init: 1024.0, factor: 2.0, window: 3 };
            let cut = cut.min(flags.len());
            let mut whole = LossScaler::new(kind).unwrap().unwrap();
            let mut first = LossScaler::new(kind).unwrap().unwrap();
            for &f in &flags[..cut] {
                whole.update(f);
                first.update(f);
            }
            let mut resumed = LossScaler::new(kind).unwrap().unwrap();
            resumed.resume(cut as u64, Some(first.state()));
            for &f in &flags[cut..] {
                prop_assert_eq!(whole.update(f), resumed.update(f));
                prop_assert_eq!(whole.state(), resumed.state());
            }
            prop_assert!(whole.scale() >= 1.0);
        }
    }
}
