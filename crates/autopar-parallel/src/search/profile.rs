//! What a device and its links cost: the constants of the search's cost model. Compute is
//! FLOPs at a rate plus bytes at a memory bandwidth; a collective is an alpha-beta model,
//! `latency + bytes the busiest rank sends * seconds per byte`, with constants per group size.
//! `autopar calibrate` measures a profile on the machine it runs on; [`DeviceProfile::builtin`]
//! is what autopar assumes without one.

use std::fmt::Write as _;

use crate::error::{ParallelError, Result};

/// Alpha-beta constants of collectives over groups of `ranks` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// The group size these constants are for.
    pub ranks: usize,
    /// Seconds per call (alpha).
    pub latency_s: f64,
    /// Seconds per byte the busiest rank sends (beta).
    pub seconds_per_byte: f64,
}

/// The constants of the cost model for one kind of device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProfile {
    /// The profile's name, as reports print it.
    pub name: String,
    /// Arithmetic rate of one device (matrix products dominate), FLOP/s.
    pub flops_per_s: f64,
    /// Bytes per second one device's ops read and write.
    pub memory_bytes_per_s: f64,
    /// Collective constants by group size, ascending; a group between two sizes takes the
    /// smaller one's constants, a larger group the largest one's.
    pub links: Vec<Link>,
}

impl DeviceProfile {
    /// The default: one CPU core's worth of a simulated device (about 40 GFLOP/s, 10 GB/s)
    /// and in-process collectives (20 µs per call, 4 GB/s).
    pub fn builtin() -> Self {
        Self {
            name: "builtin (simulated CPU devices)".into(),
            flops_per_s: 40e9,
            memory_bytes_per_s: 10e9,
            links: [2usize, 4, 8, 16]
                .iter()
                .map(|&ranks| Link { ranks, latency_s: 20e-6 * (ranks as f64).log2(), seconds_per_byte: 1.0 / 4e9 })
                .collect(),
        }
    }

    fn link(&self, ranks: usize) -> Option<&Link> {
        self.links.iter().rev().find(|l| l.ranks <= ranks).or(self.links.first())
    }

    /// Seconds of one collective call over `ranks` ranks in which the busiest rank sends `bytes`.
    pub fn comm_time(&self, ranks: usize, bytes: usize) -> f64 {
        if ranks < 2 {
            return 0.0;
        }
        match self.link(ranks) {
            Some(l) => l.latency_s + bytes as f64 * l.seconds_per_byte,
            None => 0.0,
        }
    }

    /// Seconds of the bytes alone of such a call (its latency left out): the share of one
    /// tensor in a fused bucket, whose one call's latency the bucket pays.
    pub fn bandwidth_time(&self, ranks: usize, bytes: usize) -> f64 {
        match self.link(ranks) {
            Some(l) if ranks >= 2 => bytes as f64 * l.seconds_per_byte,
            _ => 0.0,
        }
    }

    /// Seconds of `flops` arithmetic and `bytes` of memory traffic.
    pub fn compute_time(&self, flops: f64, bytes: usize) -> f64 {
        flops / self.flops_per_s + bytes as f64 / self.memory_bytes_per_s
    }

    /// The profile as TOML (what `autopar calibrate` writes).
    pub fn to_toml(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# autopar device profile: the constants of the strategy search's cost model");
        let _ = writeln!(s, "name = {:?}", self.name);
        let _ = writeln!(s, "flops_per_s = {:e}", self.flops_per_s);
        let _ = writeln!(s, "memory_bytes_per_s = {:e}", self.memory_bytes_per_s);
        for l in &self.links {
            let _ =
                writeln!(s, "\n[[links]]\nranks = {}\nlatency_s = {:e}\nseconds_per_byte = {:e}", l.ranks, l.latency_s, l.seconds_per_byte);
        }
        s
    }

    /// A profile from its TOML form read as JSON (`name`, `flops_per_s`, `memory_bytes_per_s`,
    /// `[[links]]` with `ranks`, `latency_s`, `seconds_per_byte`), checked; `source` names the
    /// file in errors.
    pub fn from_json(v: &serde_json::Value, source: &str) -> Result<Self> {
        let bad = |what: String| ParallelError::BadProfile { origin: source.to_string(), problem: what };
        let num = |obj: &serde_json::Value, key: &str, at: &str| -> Result<f64> {
            obj.get(key).and_then(|x| x.as_f64()).ok_or_else(|| bad(format!("{at}{key} is missing or not a number")))
        };
        // Keys the profile does not have are refused (a misspelt rate would leave the default).
        let known = |obj: &serde_json::Value, keys: &[&str], at: &str| -> Result<()> {
            match obj.as_object().and_then(|o| o.keys().find(|k| !keys.contains(&k.as_str()))) {
                Some(k) => Err(bad(format!("{at}{k} is not a key of a device profile (keys: {})", keys.join(", ")))),
                None => Ok(()),
            }
        };
        known(v, &["name", "flops_per_s", "memory_bytes_per_s", "links"], "")?;
        let links = v
            .get("links")
            .and_then(|l| l.as_array())
            .ok_or_else(|| bad("[[links]] entries are missing".into()))?
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let at = format!("links[{i}].");
                known(l, &["ranks", "latency_s", "seconds_per_byte"], &at)?;
                let ranks =
                    l.get("ranks").and_then(|x| x.as_u64()).ok_or_else(|| bad(format!("{at}ranks is missing or not an integer")))?;
                Ok(Link { ranks: ranks as usize, latency_s: num(l, "latency_s", &at)?, seconds_per_byte: num(l, "seconds_per_byte", &at)? })
            })
            .collect::<Result<Vec<_>>>()?;
        let p = Self {
            name: v.get("name").and_then(|x| x.as_str()).unwrap_or(source).to_string(),
            flops_per_s: num(v, "flops_per_s", "")?,
            memory_bytes_per_s: num(v, "memory_bytes_per_s", "")?,
            links,
        };
        p.validate(source)?;
        Ok(p)
    }

    /// Check the constants: positive rates, group sizes of at least 2 in ascending order.
    pub fn validate(&self, source: &str) -> Result<()> {
        let bad = |what: String| Err(ParallelError::BadProfile { origin: source.to_string(), problem: what });
        if !(self.flops_per_s > 0.0 && self.flops_per_s.is_finite()) {
            return bad(format!("flops_per_s must be a positive number, got {}", self.flops_per_s));
        }
        if !(self.memory_bytes_per_s > 0.0 && self.memory_bytes_per_s.is_finite()) {
            return bad(format!("memory_bytes_per_s must be a positive number, got {}", self.memory_bytes_per_s));
        }
        if self.links.is_empty() {
            return bad("at least one [[links]] entry is needed".into());
        }
        for (i, l) in self.links.iter().enumerate() {
            if l.ranks < 2 || (i > 0 && l.ranks <= self.links[i - 1].ranks) {
                return bad(format!("links[{i}].ranks = {}: group sizes start at 2 and ascend", l.ranks));
            }
            if !(l.latency_s >= 0.0 && l.seconds_per_byte >= 0.0 && l.latency_s.is_finite() && l.seconds_per_byte.is_finite()) {
                return bad(format!("links[{i}]: latency_s and seconds_per_byte must be numbers >= 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_take_the_constants_of_the_nearest_smaller_size() {
        let p = DeviceProfile::builtin();
        assert_eq!(p.comm_time(1, 1000), 0.0);
        let two = p.comm_time(2, 0);
        let three = p.comm_time(3, 0);
        assert_eq!(two, three);
        assert!(p.comm_time(4, 0) > two);
        assert!(p.comm_time(4096, 0) == p.comm_time(16, 0));
        assert!(p.comm_time(2, 1 << 20) > p.comm_time(2, 1 << 10));
        p.validate("builtin").unwrap();
    }

    #[test]
    fn bad_profiles_are_refused_with_the_field() {
        let mut p = DeviceProfile::builtin();
        p.links[1].ranks = 2;
        let e = p.validate("p.toml").unwrap_err().to_string();
        assert!(e.contains("p.toml") && e.contains("links[1]"), "{e}");
        let mut p = DeviceProfile::builtin();
        p.flops_per_s = 0.0;
        assert!(p.validate("x").unwrap_err().to_string().contains("flops_per_s"));
    }
}
