//! Where an instance's granules go. A pure function of the candidates, so every policy
//! is tested without a database or servers.
//!
//! * `Bandwidth` spreads the granules round-robin over as many nodes as there are
//!   granules (most free space first), so the instance gets the most servers' bandwidth.
//! * `Isolation` packs them onto as few nodes as possible (most free space first), so
//!   the instance shares the fewest servers with other jobs.

use spillway_api::Policy;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node: String,
    pub free_granules: u64,
}

/// The pool cannot hold the request: what it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub free_granules: u64,
    pub usable_nodes: usize,
}

/// Granules per node, in fragment order (the order the placement function sees).
pub fn place(
    granules: u64,
    candidates: &[Candidate],
    policy: Policy,
) -> Result<Vec<(String, u64)>, Shortfall> {
    let mut usable: Vec<&Candidate> = candidates.iter().filter(|c| c.free_granules > 0).collect();
    let free: u64 = usable.iter().map(|c| c.free_granules).sum();
    if granules == 0 || free < granules {
        return Err(Shortfall {
            free_granules: free,
            usable_nodes: usable.len(),
        });
    }
    // Most free first; the name breaks ties so the result is deterministic.
    usable.sort_by(|a, b| {
        b.free_granules
            .cmp(&a.free_granules)
            .then_with(|| a.node.cmp(&b.node))
    });
    let mut given: Vec<u64> = vec![0; usable.len()];
    match policy {
        Policy::Isolation => {
            let mut left = granules;
            for (i, c) in usable.iter().enumerate() {
                let take = left.min(c.free_granules);
                given[i] = take;
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        Policy::Bandwidth => {
            let mut left = granules;
            while left > 0 {
                let mut progressed = false;
                for (i, c) in usable.iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    if given[i] < c.free_granules {
                        given[i] += 1;
                        left -= 1;
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
        }
    }
    Ok(usable
        .iter()
        .zip(given)
        .filter(|(_, g)| *g > 0)
        .map(|(c, g)| (c.node.clone(), g))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(node: &str, free: u64) -> Candidate {
        Candidate {
            node: node.into(),
            free_granules: free,
        }
    }

    #[test]
    fn bandwidth_spreads() {
        let cs = [c("a", 10), c("b", 10), c("c", 10)];
        let p = place(4, &cs, Policy::Bandwidth).unwrap();
        assert_eq!(p, vec![("a".into(), 2), ("b".into(), 1), ("c".into(), 1)]);
        let p = place(2, &cs, Policy::Bandwidth).unwrap();
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn isolation_packs() {
        let cs = [c("a", 3), c("b", 10), c("c", 10)];
        let p = place(4, &cs, Policy::Isolation).unwrap();
        assert_eq!(p, vec![("b".into(), 4)]);
        let p = place(12, &cs, Policy::Isolation).unwrap();
        assert_eq!(p, vec![("b".into(), 10), ("c".into(), 2)]);
    }

    #[test]
    fn spreading_respects_full_nodes() {
        let cs = [c("a", 1), c("b", 5)];
        let p = place(6, &cs, Policy::Bandwidth).unwrap();
        assert_eq!(p, vec![("b".into(), 5), ("a".into(), 1)]);
    }

    #[test]
    fn shortfall_says_what_is_free() {
        let cs = [c("a", 1), c("b", 2), c("z", 0)];
        let e = place(4, &cs, Policy::Bandwidth).unwrap_err();
        assert_eq!(
            e,
            Shortfall {
                free_granules: 3,
                usable_nodes: 2
            }
        );
        assert!(place(1, &[], Policy::Isolation).is_err());
    }

    #[test]
    fn never_more_than_free_and_exactly_requested() {
        // A small exhaustive sweep instead of a property-test dependency.
        for a in 0..5u64 {
            for b in 0..5u64 {
                for n in 1..10u64 {
                    for pol in [Policy::Bandwidth, Policy::Isolation] {
                        let cs = [c("a", a), c("b", b)];
                        match place(n, &cs, pol) {
                            Ok(p) => {
                                assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), n);
                                for (node, g) in p {
                                    let free = cs.iter().find(|x| x.node == node).unwrap();
                                    assert!(g <= free.free_granules);
                                }
                            }
                            Err(_) => assert!(a + b < n),
                        }
                    }
                }
            }
        }
    }
}
