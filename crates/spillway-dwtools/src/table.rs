//! Plain text tables: a header line and one line per object, every column left-aligned
//! and padded to its widest cell, columns separated by one space, no trailing spaces.
//! An empty table is its header line alone, so scripts always find the header.

pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// A table whose header is `line` as printed: the column names separated by spaces
    /// (no name holds one).
    pub fn with_header(line: &'static str) -> Table {
        Table::new(&line.split_whitespace().collect::<Vec<_>>())
    }

    /// The table of `items` under the header `line` (as `with_header`), one row each
    /// (`row`: its cells in header order).
    pub fn list<T>(line: &'static str, items: &[T], row: impl Fn(&T) -> Vec<String>) -> String {
        let mut t = Table::with_header(line);
        for i in items {
            t.row(row(i));
        }
        t.render()
    }

    /// One object's cells, in header order.
    pub fn row(&mut self, cells: Vec<String>) {
        // A short or long row would shift columns silently; every caller builds rows
        // from a fixed list, so a mismatch is a bug here, not bad input.
        debug_assert_eq!(cells.len(), self.header.len(), "row {cells:?}");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(c);
                let pad = w.saturating_sub(c.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_widest_cell() {
        let mut t = Table::new(&["a", "bb", "c"]);
        t.row(vec!["xxx".into(), "y".into(), "z".into()]);
        t.row(vec!["1".into(), "22222".into(), "3".into()]);
        assert_eq!(t.render(), "a   bb    c\nxxx y     z\n1   22222 3\n");
    }

    #[test]
    fn empty_table_is_its_header() {
        assert_eq!(Table::new(&["pool", "units"]).render(), "pool units\n");
    }
}
