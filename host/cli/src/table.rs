//! Aligned text tables for listings: every column as wide as its widest
//! cell, two spaces between columns, no trailing blanks.

/// A table with a header row.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row (missing cells are blank, extra ones are kept).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines of text.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, width) in widths.iter().enumerate() {
                let cell = row.get(c).map(String::as_str).unwrap_or("");
                line.push_str(cell);
                if c + 1 < columns {
                    let pad = width - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_line_up_whatever_the_cell_widths() {
        let mut t = Table::new(&["NAME", "SNAPSHOT ID", "READY"]);
        t.row(vec![
            "a".into(),
            "berth-0123456789abcdef".into(),
            "true".into(),
        ]);
        t.row(vec!["longer-name".into(), "x".into(), "false".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        let col = |l: &str, word: &str| l.find(word).unwrap();
        assert_eq!(col(lines[0], "SNAPSHOT ID"), col(lines[1], "berth-"));
        assert_eq!(col(lines[0], "SNAPSHOT ID"), col(lines[2], "x"));
        assert_eq!(col(lines[0], "READY"), col(lines[1], "true"));
        assert_eq!(col(lines[0], "READY"), col(lines[2], "false"));
        assert!(lines.iter().all(|l| !l.ends_with(' ')));
    }
}
