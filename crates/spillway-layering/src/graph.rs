//! Cycles in a directed graph, found as strongly connected components (Tarjan) and
//! each shown as one closed chain through it, so that a report reads
//! `a.rs:8 → b.rs:664 → a.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A graph over nodes `0..n`; each edge keeps a label (where the dependency is written).
#[derive(Debug, Default)]
pub struct Graph<L> {
    n: usize,
    edges: BTreeMap<usize, BTreeMap<usize, L>>,
}

impl<L: Clone> Graph<L> {
    pub fn new(n: usize) -> Self {
        Graph {
            n,
            edges: BTreeMap::new(),
        }
    }

    /// Adds `from → to`; the first label given for a pair is kept. Self-loops are
    /// ignored (a file naming its own items is no dependency).
    pub fn add(&mut self, from: usize, to: usize, label: L) {
        if from != to {
            self.edges
                .entry(from)
                .or_default()
                .entry(to)
                .or_insert(label);
        }
    }

    fn succ(&self, v: usize) -> impl Iterator<Item = (usize, &L)> {
        self.edges
            .get(&v)
            .into_iter()
            .flat_map(|m| m.iter().map(|(&w, l)| (w, l)))
    }

    /// The components with more than one node, each sorted, in order of their smallest.
    pub fn cyclic_components(&self) -> Vec<Vec<usize>> {
        let mut s = Tarjan {
            index: vec![None; self.n],
            low: vec![0; self.n],
            on_stack: vec![false; self.n],
            stack: Vec::new(),
            next: 0,
            out: Vec::new(),
        };
        for v in 0..self.n {
            if s.index[v].is_none() {
                s.visit(self, v);
            }
        }
        let mut out: Vec<Vec<usize>> = s.out.into_iter().filter(|c| c.len() > 1).collect();
        for c in &mut out {
            c.sort_unstable();
        }
        out.sort();
        out
    }

    /// The edges between nodes of `comp` (from, to, label), in node order.
    pub fn edges_within(&self, comp: &[usize]) -> Vec<(usize, usize, L)> {
        let inside: BTreeSet<usize> = comp.iter().copied().collect();
        comp.iter()
            .flat_map(|&v| self.succ(v).map(move |(w, l)| (v, w, l.clone())))
            .filter(|(_, w, _)| inside.contains(w))
            .collect()
    }

    /// A shortest chain of edges from `a` to `b` through nodes of `comp` only.
    pub fn path_within(
        &self,
        comp: &[usize],
        a: usize,
        b: usize,
    ) -> Option<Vec<(usize, usize, L)>> {
        let inside: BTreeSet<usize> = comp.iter().copied().collect();
        let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([a]);
        while let Some(v) = queue.pop_front() {
            if v == b {
                break;
            }
            for (w, _) in self.succ(v) {
                if inside.contains(&w) && w != a && !prev.contains_key(&w) {
                    prev.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut nodes = vec![b];
        let mut v = b;
        while v != a {
            v = *prev.get(&v)?;
            nodes.push(v);
        }
        nodes.reverse();
        nodes
            .windows(2)
            .map(|p| Some((p[0], p[1], self.edges.get(&p[0])?.get(&p[1])?.clone())))
            .collect()
    }

    /// A shortest closed chain through the edge `from → to` of `comp`.
    pub fn cycle_through(&self, comp: &[usize], from: usize, to: usize) -> Vec<(usize, usize, L)> {
        let Some(first) = self.edges.get(&from).and_then(|m| m.get(&to)) else {
            return Vec::new();
        };
        let mut chain = vec![(from, to, first.clone())];
        chain.extend(self.path_within(comp, to, from).unwrap_or_default());
        chain
    }

    /// A shortest closed chain through the first node of `comp`.
    pub fn cycle_in(&self, comp: &[usize]) -> Vec<(usize, usize, L)> {
        let Some(&start) = comp.first() else {
            return Vec::new();
        };
        let Some((_, to, _)) = self.edges_within(comp).into_iter().find(|e| e.0 == start) else {
            return Vec::new();
        };
        self.cycle_through(comp, start, to)
    }
}

struct Tarjan {
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    out: Vec<Vec<usize>>,
}

impl Tarjan {
    // Recursion depth is at most the number of files in one target (a few hundred).
    fn visit<L: Clone>(&mut self, g: &Graph<L>, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for (w, _) in g.succ(v) {
            match self.index[w] {
                None => {
                    self.visit(g, w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            self.out.push(comp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Graph;

    #[test]
    fn acyclic_has_no_components() {
        let mut g = Graph::new(3);
        g.add(0, 1, "a");
        g.add(1, 2, "b");
        g.add(0, 2, "c");
        g.add(2, 2, "self");
        assert!(g.cyclic_components().is_empty());
    }

    #[test]
    fn two_cycles_reported_as_chains() {
        let mut g = Graph::new(6);
        g.add(0, 1, "0→1");
        g.add(1, 0, "1→0");
        g.add(2, 3, "2→3");
        g.add(3, 4, "3→4");
        g.add(4, 2, "4→2");
        g.add(4, 5, "4→5");
        let comps = g.cyclic_components();
        assert_eq!(comps, [vec![0, 1], vec![2, 3, 4]]);
        let chain: Vec<&str> = g.cycle_in(&comps[1]).into_iter().map(|e| e.2).collect();
        assert_eq!(chain, ["2→3", "3→4", "4→2"]);
        assert_eq!(g.cycle_in(&comps[0]).len(), 2);
    }

    #[test]
    fn first_label_is_kept() {
        let mut g = Graph::new(2);
        g.add(0, 1, 8);
        g.add(0, 1, 20);
        g.add(1, 0, 3);
        assert_eq!(g.cycle_in(&[0, 1]), [(0, 1, 8), (1, 0, 3)]);
    }
}
