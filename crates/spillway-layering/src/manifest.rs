//! The two things the checks need from a crate's `Cargo.toml`: its package name and its
//! normal dependencies (`[dependencies]`, `[target.….dependencies]`, and the table form
//! `[dependencies.x]`), each with its line. Dev- and build-dependencies are left out:
//! tests may reach anything. Plain line reading: the workspace's manifests are simple.

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub name: String,
    /// (dependency name as the manifest spells it, line)
    pub deps: Vec<(String, u32)>,
}

pub fn parse(text: &str) -> Manifest {
    let mut m = Manifest::default();
    let mut section = String::new();
    for (n, raw) in text.lines().enumerate() {
        let line_no = u32::try_from(n + 1).unwrap_or(u32::MAX);
        let line = strip_comment(raw).trim();
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header.trim().trim_matches(['[', ']']).to_string();
            if let Some(dep) = table_dependency(&section) {
                m.deps.push((dep.to_string(), line_no));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_matches('"');
        if section == "package" && key == "name" {
            m.name = value.trim().trim_matches('"').to_string();
        } else if is_dependency_section(&section) {
            m.deps.push((key.to_string(), line_no));
        }
    }
    m
}

fn is_dependency_section(s: &str) -> bool {
    s == "dependencies" || (s.starts_with("target.") && s.ends_with(".dependencies"))
}

/// `dependencies.x` or `target.….dependencies.x` → `x`.
fn table_dependency(s: &str) -> Option<&str> {
    let (head, name) = s.rsplit_once('.')?;
    is_dependency_section(head).then_some(name.trim_matches('"'))
}

/// The line without a trailing `# comment` (a `#` inside a string is kept).
fn strip_comment(line: &str) -> &str {
    let mut in_str = false;
    for (i, ch) in line.char_indices() {
        match ch {
            '"' => in_str = !in_str,
            '#' if !in_str => return &line[..i],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_name_and_normal_dependencies_only() {
        let m = parse(
            "[package]\nname = \"spillway-x\" # the x\n\n[dependencies]\n\
             spillway-types = { workspace = true }\n# spillway-gone = \"1\"\nserde = \"1\"\n\
             [dev-dependencies]\nspillway-test = { path = \"x\" }\n\
             [target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n\
             [dependencies.spillway-wire]\npath = \"../w\"\n\
             [build-dependencies]\ncc = \"1\"\n",
        );
        assert_eq!(m.name, "spillway-x");
        let deps: Vec<(&str, u32)> = m.deps.iter().map(|(d, l)| (d.as_str(), *l)).collect();
        assert_eq!(
            deps,
            [
                ("spillway-types", 5),
                ("serde", 7),
                ("libc", 11),
                ("spillway-wire", 12)
            ]
        );
    }
}
