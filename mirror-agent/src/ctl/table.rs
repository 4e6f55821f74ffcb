//! Aligned text tables for human output.

/// Renders rows under a header, each column as wide as its widest cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let s: Vec<String> = cells.zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        s.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let t = super::render(
            &["ID", "RULE"],
            &[vec!["1".into(), "status=500".into()], vec!["10".into(), "x".into()]],
        );
        assert_eq!(t, "ID  RULE\n1   status=500\n10  x\n");
    }
}
