//! The weekly report's figures (M3): a Wilson score interval for a
//! proportion, the daily judge's recall estimated from a spot check, its
//! precision from the owner's verdicts, and Cohen's κ between the judge and
//! the owner with the confusion matrix.
//!
//! Must never: state a figure without its counts, or a precision or κ from
//! fewer than [`MIN_VERDICTS`] verdicts.

use serde::Serialize;

/// Verdicts needed before precision and κ are stated; below it the weekly
/// report says "not enough verdicts". Ten keeps a one-verdict swing under
/// ten points of precision.
pub(crate) const MIN_VERDICTS: u64 = 10;
/// z for a 95 % interval.
pub(crate) const Z95: f64 = 1.959_963_984_540_054;

/// Wilson score interval of `k` successes in `n` trials; `None` for n = 0.
pub(crate) fn wilson(k: u64, n: u64, z: f64) -> Option<(f64, f64)> {
    if n == 0 || k > n {
        return None;
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * ((p * (1.0 - p) / n) + z2 / (4.0 * n * n)).sqrt() / denom;
    Some(((centre - half).max(0.0), (centre + half).min(1.0)))
}

/// The recall spot check: exchanges the daily judge flagged, the ones it
/// did not, and of a sample of the latter how many the weekly judge flagged.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Recall {
    pub flagged: u64,
    pub unflagged: u64,
    pub sampled: u64,
    pub missed_in_sample: u64,
    /// flagged / (flagged + estimated misses); `None` when nothing was
    /// flagged and nothing missed, or nothing could be sampled.
    pub estimate: Option<f64>,
    /// 95 % interval, from the Wilson interval of the sample's miss rate.
    pub interval: Option<(f64, f64)>,
}

pub(crate) fn recall(flagged: u64, unflagged: u64, sampled: u64, missed: u64) -> Recall {
    let at = |miss_rate: f64| {
        let missed_total = miss_rate * unflagged as f64;
        let denom = flagged as f64 + missed_total;
        if denom <= 0.0 {
            None
        } else {
            Some(flagged as f64 / denom)
        }
    };
    let (estimate, interval) = if unflagged == 0 {
        // Everything was flagged: no miss is possible.
        (
            (flagged > 0).then_some(1.0),
            (flagged > 0).then_some((1.0, 1.0)),
        )
    } else if sampled == 0 {
        (None, None)
    } else {
        let p = missed as f64 / sampled as f64;
        let interval = wilson(missed, sampled, Z95).and_then(|(lo, hi)| Some((at(hi)?, at(lo)?)));
        (at(p), interval)
    };
    Recall {
        flagged,
        unflagged,
        sampled,
        missed_in_sample: missed,
        estimate,
        interval,
    }
}

/// Judge against owner, over the ledger's approved rows: "real" is any
/// decision but `reject`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Confusion {
    /// Judge real, owner real.
    pub both_real: u64,
    /// Judge real, owner fine.
    pub judge_only: u64,
    /// Judge fine, owner real.
    pub owner_only: u64,
    /// Judge fine, owner fine.
    pub both_fine: u64,
}

impl Confusion {
    pub(crate) fn n(&self) -> u64 {
        self.both_real + self.judge_only + self.owner_only + self.both_fine
    }

    /// Cohen's κ; `None` below [`MIN_VERDICTS`] or when chance agreement is
    /// total (both raters used one class only).
    pub(crate) fn kappa(&self) -> Option<f64> {
        let n = self.n();
        if n < MIN_VERDICTS {
            return None;
        }
        let nf = n as f64;
        let po = (self.both_real + self.both_fine) as f64 / nf;
        let judge_real = (self.both_real + self.judge_only) as f64 / nf;
        let owner_real = (self.both_real + self.owner_only) as f64 / nf;
        let pe = judge_real * owner_real + (1.0 - judge_real) * (1.0 - owner_real);
        if (1.0 - pe).abs() < f64::EPSILON {
            return None;
        }
        Some((po - pe) / (1.0 - pe))
    }
}

/// Precision of the daily judge: findings the owner approved as real over
/// findings judged (every ledger row with an owner verdict).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Precision {
    pub real: u64,
    pub judged: u64,
    /// `None` below [`MIN_VERDICTS`].
    pub value: Option<f64>,
}

pub(crate) fn precision(real: u64, judged: u64) -> Precision {
    Precision {
        real,
        judged,
        value: (judged >= MIN_VERDICTS).then(|| real as f64 / judged as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn review_stats_wilson_matches_known_values() {
        // 0 of 50: upper bound 0.0713 (the rule of three is 0.06).
        let (lo, hi) = wilson(0, 50, Z95).unwrap();
        assert!(close(lo, 0.0) && close(hi, 0.0713), "{lo} {hi}");
        let (lo, hi) = wilson(5, 10, Z95).unwrap();
        assert!(close(lo, 0.2366) && close(hi, 0.7634), "{lo} {hi}");
        assert!(wilson(1, 0, Z95).is_none());
    }

    #[test]
    fn review_stats_recall_from_a_spot_check() {
        // 9 flagged, 100 unflagged, 2 of 50 sampled missed: ~4 missed, recall ~0.69.
        let r = recall(9, 100, 50, 2);
        assert!(close(r.estimate.unwrap(), 9.0 / 13.0), "{r:?}");
        let (lo, hi) = r.interval.unwrap();
        assert!(
            lo < r.estimate.unwrap() && r.estimate.unwrap() < hi && hi <= 1.0,
            "{r:?}"
        );
        assert_eq!(recall(3, 0, 0, 0).estimate, Some(1.0));
        assert_eq!(recall(0, 10, 0, 0).estimate, None);
        assert_eq!(
            recall(0, 10, 5, 0).estimate,
            None,
            "nothing flagged, nothing missed"
        );
        assert_eq!(recall(0, 10, 5, 1).estimate, Some(0.0));
    }

    #[test]
    fn review_stats_kappa_and_precision_need_enough_verdicts() {
        let c = Confusion {
            both_real: 6,
            judge_only: 2,
            owner_only: 1,
            both_fine: 3,
        };
        assert_eq!(c.n(), 12);
        // po = 0.75, pe = (8/12)(7/12) + (4/12)(5/12) = 0.5278 → κ = 0.4706
        assert!(close(c.kappa().unwrap(), 0.4706), "{:?}", c.kappa());
        let few = Confusion {
            both_real: 5,
            ..Default::default()
        };
        assert_eq!(few.kappa(), None);
        let one_class = Confusion {
            both_real: 12,
            ..Default::default()
        };
        assert_eq!(one_class.kappa(), None);
        assert_eq!(precision(7, 9).value, None);
        assert!(close(precision(9, 12).value.unwrap(), 0.75));
    }
}
