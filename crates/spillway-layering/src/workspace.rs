//! Every crate under `crates/`: its manifest and its targets (lib, main, bins), with file
//! paths relative to the workspace root so that reports name files as a developer types
//! them.

use crate::manifest::{self, Manifest};
use crate::model::Target;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Crate {
    /// `crates/spillway-wire`
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// The library first when there is one, then `main.rs`, then `src/bin/*`.
    pub targets: Vec<Target>,
}

impl Crate {
    /// The name code uses for it (`spillway_wire`).
    pub fn ident(&self) -> String {
        self.manifest.name.replace('-', "_")
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join("Cargo.toml")
    }

    /// The library target, if the crate has one.
    pub fn lib(&self) -> Option<&Target> {
        self.targets.first().filter(|t| {
            t.files
                .first()
                .is_some_and(|f| f.path.ends_with("src/lib.rs"))
        })
    }
}

/// The crates under `root/crates`, sorted by directory.
pub fn load(root: &Path) -> Result<Vec<Crate>, String> {
    let read = |p: &Path| fs::read_to_string(root.join(p)).ok();
    let mut dirs = list(&root.join("crates"))?;
    dirs.sort();
    let mut out = Vec::new();
    for abs in dirs {
        let Some(name) = abs.file_name() else {
            continue;
        };
        let dir = Path::new("crates").join(name);
        let Some(text) = read(&dir.join("Cargo.toml")) else {
            continue;
        };
        let mut roots = Vec::new();
        for main in ["src/lib.rs", "src/main.rs"] {
            if root.join(&dir).join(main).is_file() {
                roots.push(dir.join(main));
            }
        }
        let bin = root.join(&dir).join("src/bin");
        if bin.is_dir() {
            let mut bins = Vec::new();
            for p in list(&bin)? {
                let rel = p
                    .strip_prefix(root)
                    .map_err(|e| e.to_string())?
                    .to_path_buf();
                if p.extension().is_some_and(|e| e == "rs") {
                    bins.push(rel);
                } else if p.join("main.rs").is_file() {
                    bins.push(rel.join("main.rs"));
                }
            }
            bins.sort();
            roots.extend(bins);
        }
        let targets = roots
            .iter()
            .map(|r| Target::load(r, &read))
            .collect::<Result<_, _>>()?;
        out.push(Crate {
            dir,
            manifest: manifest::parse(&text),
            targets,
        });
    }
    Ok(out)
}

fn list(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let rd = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(rd.filter_map(Result::ok).map(|e| e.path()).collect())
}
