//! Where the next I/O goes: sequential, uniform random, or Zipf-distributed blocks of the job's region.
//!
//! Zipf uses rejection-inversion sampling (Hörmann and Derflinger, 1996): O(1) per sample, no table, any
//! θ > 0. Popular ranks are then scattered over the region by a multiplicative bijection (rank × p mod n with
//! p coprime to n), as fio scatters its hot blocks, so that the hottest blocks are not all adjacent.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use super::options::RandomDistribution;

/// Samples ranks 1..=n with probability ∝ rank^-θ.
#[derive(Clone, Debug)]
pub struct ZipfSampler {
    n: f64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl ZipfSampler {
    /// A sampler over `1..=n` (n ≥ 1) with exponent `theta` > 0.
    pub fn new(n: u64, theta: f64) -> Self {
        let n = n.max(1) as f64;
        let mut sampler = Self { n, theta, h_integral_x1: 0.0, h_integral_n: 0.0, s: 0.0 };
        sampler.h_integral_x1 = sampler.h_integral(1.5) - 1.0;
        sampler.h_integral_n = sampler.h_integral(n + 0.5);
        sampler.s = 2.0 - sampler.h_integral_inverse(sampler.h_integral(2.5) - sampler.h(2.0));
        sampler
    }

    /// One rank in `1..=n`.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        // Bounded: the acceptance probability of each round is high (> 0.5 for every θ), so 64 rounds fail
        // with negligible probability; then the last candidate is still a valid rank.
        let mut candidate = 1.0;
        for _ in 0..64 {
            let u = self.h_integral_n + rng.random::<f64>() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            candidate = (x + 0.5).floor().clamp(1.0, self.n);
            if candidate - x <= self.s || u >= self.h_integral(candidate + 0.5) - self.h(candidate) {
                break;
            }
        }
        candidate as u64
    }

    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.theta) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let mut t = x * (1.0 - self.theta);
        if t < -1.0 {
            t = -1.0;
        }
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.ln_1p() / x } else { 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)) }
}

/// `(e^x - 1) / x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.exp_m1() / x } else { 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x)) }
}

/// Picks block indices within a region of `blocks` blocks.
#[derive(Clone, Debug)]
pub enum BlockPicker {
    /// The next block in order, wrapping at the end.
    Sequential {
        /// The next block.
        next: u64,
        /// Blocks in the region.
        blocks: u64,
    },
    /// Uniform.
    Uniform {
        /// Blocks in the region.
        blocks: u64,
    },
    /// Zipf over ranks, scattered.
    Zipf {
        /// The sampler.
        sampler: ZipfSampler,
        /// Blocks in the region.
        blocks: u64,
        /// The scatter multiplier, coprime to `blocks`.
        multiplier: u64,
    },
}

impl BlockPicker {
    /// A picker for a region of `blocks` blocks.
    pub fn new(blocks: u64, random: bool, distribution: RandomDistribution) -> Self {
        match (random, distribution) {
            (false, _) => BlockPicker::Sequential { next: 0, blocks },
            (true, RandomDistribution::Random) => BlockPicker::Uniform { blocks },
            (true, RandomDistribution::Zipf(theta)) => BlockPicker::Zipf {
                sampler: ZipfSampler::new(blocks, theta),
                blocks,
                multiplier: coprime_multiplier(blocks),
            },
        }
    }

    /// The next block index.
    pub fn next(&mut self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            BlockPicker::Sequential { next, blocks } => {
                let block = *next;
                *next = (*next + 1) % *blocks;
                block
            }
            BlockPicker::Uniform { blocks } => rng.random_range(0..*blocks),
            BlockPicker::Zipf { sampler, blocks, multiplier } => {
                let rank = sampler.sample(rng) - 1;
                ((u128::from(rank) * u128::from(*multiplier)) % u128::from(*blocks)) as u64
            }
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A large multiplier coprime to `blocks` (so rank → block is a bijection).
fn coprime_multiplier(blocks: u64) -> u64 {
    if blocks <= 1 {
        return 1;
    }
    let mut multiplier = 0x9E37_79B9_7F4A_7C15 % blocks;
    while gcd(multiplier.max(1), blocks) != 1 {
        multiplier = (multiplier + 1) % blocks;
    }
    multiplier.max(1)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn zipf_frequencies_follow_the_power_law() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let sampler = ZipfSampler::new(1000, 1.2);
        let mut counts = vec![0u64; 1001];
        let samples = 200_000;
        for _ in 0..samples {
            let rank = sampler.sample(&mut rng);
            assert!((1..=1000).contains(&rank));
            counts[rank as usize] += 1;
        }
        // P(1) / P(2) = 2^1.2 ≈ 2.30; P(1) / P(10) = 10^1.2 ≈ 15.8.
        let ratio_2 = counts[1] as f64 / counts[2] as f64;
        let ratio_10 = counts[1] as f64 / counts[10] as f64;
        assert!((2.1..2.5).contains(&ratio_2), "{ratio_2}");
        assert!((13.5..18.5).contains(&ratio_10), "{ratio_10}");
        // The harmonic normaliser H(1000, 1.2) ≈ 4.23, so rank 1 gets ≈ 23.6% of samples.
        let share_1 = counts[1] as f64 / samples as f64;
        assert!((0.22..0.25).contains(&share_1), "{share_1}");
    }

    #[test]
    fn zipf_works_for_theta_one_and_tiny_regions() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for (n, theta) in [(1u64, 1.0), (2, 1.0), (10, 0.5), (1 << 30, 1.0)] {
            let sampler = ZipfSampler::new(n, theta);
            for _ in 0..1000 {
                assert!((1..=n).contains(&sampler.sample(&mut rng)));
            }
        }
    }

    #[test]
    fn scattering_is_a_bijection() {
        for blocks in [1u64, 2, 10, 1024, 1_048_576, 999_983] {
            let multiplier = coprime_multiplier(blocks);
            assert_eq!(gcd(multiplier, blocks), 1, "blocks {blocks}");
        }
        let blocks = 1000;
        let multiplier = coprime_multiplier(blocks);
        let mut seen = vec![false; blocks as usize];
        for rank in 0..blocks {
            seen[((rank * multiplier) % blocks) as usize] = true;
        }
        assert!(seen.iter().all(|&hit| hit));
    }

    #[test]
    fn sequential_wraps_and_uniform_covers() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut sequential = BlockPicker::new(3, false, RandomDistribution::Random);
        let picked: Vec<u64> = (0..7).map(|_| sequential.next(&mut rng)).collect();
        assert_eq!(picked, vec![0, 1, 2, 0, 1, 2, 0]);
        let mut uniform = BlockPicker::new(16, true, RandomDistribution::Random);
        let mut seen = [false; 16];
        for _ in 0..1000 {
            seen[uniform.next(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|&hit| hit));
    }
}
