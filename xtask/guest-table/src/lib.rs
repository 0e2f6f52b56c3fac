//! The one table of example plugins, `guest-examples/guests.toml`: what
//! each guest is called, its language, its world and where its component
//! is built. xtask builds from it; the tests and the benchmarks find
//! components through it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// How a guest is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// The guest-examples cargo workspace, `wasm32-wasip2`.
    Rust,
    /// wit-bindgen C bindings, clang, the preview1 reactor adapter.
    C,
    /// componentize-py.
    Python,
    /// componentize-js.
    Javascript,
}

impl Language {
    /// The language's name, as shown in tables.
    pub fn label(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::C => "C",
            Language::Python => "Python",
            Language::Javascript => "JavaScript",
        }
    }
}

/// One guest.
#[derive(Debug, Clone, Deserialize)]
pub struct Guest {
    /// Directory under `guest-examples/`, and the plugin's name.
    pub name: String,
    /// How it is built.
    pub language: Language,
    /// `remote-client-plugin` or `snapshot-plugin`.
    pub world: String,
    /// The built component, relative to `guest-examples/`.
    pub component: PathBuf,
    /// A working example store (not test-only).
    #[serde(default)]
    pub example: bool,
    /// Measured by the benchmarks.
    #[serde(default)]
    pub bench: bool,
    /// Slow to compile (an interpreter): left out of quick runs.
    #[serde(default)]
    pub heavy: bool,
}

impl Guest {
    /// `name (Language)`, for tables.
    pub fn label(&self) -> String {
        format!("{} ({})", self.name, self.language.label())
    }

    /// Whether it exports the `snapshot-plugin` world.
    pub fn is_snapshot_plugin(&self) -> bool {
        self.world == "snapshot-plugin"
    }
}

#[derive(Deserialize)]
struct Table {
    guest: Vec<Guest>,
}

/// The guest-examples directory of the repository at `root`.
pub fn guests_dir(root: &Path) -> PathBuf {
    root.join("guest-examples")
}

/// Every guest, in table order.
pub fn guests(root: &Path) -> Result<Vec<Guest>, String> {
    let path = guests_dir(root).join("guests.toml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    toml::from_str::<Table>(&text)
        .map(|t| t.guest)
        .map_err(|e| format!("{} is not a valid guest table: {e}", path.display()))
}

/// The guest called `name`.
pub fn guest(root: &Path, name: &str) -> Result<Guest, String> {
    guests(root)?
        .into_iter()
        .find(|g| g.name == name)
        .ok_or_else(|| format!("no guest {name:?} in guest-examples/guests.toml"))
}

/// Where `guest`'s component is built.
pub fn component_path(root: &Path, guest: &Guest) -> PathBuf {
    guests_dir(root).join(&guest.component)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_parses_and_names_each_guest_once() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let guests = super::guests(&root).unwrap();
        let mut names: Vec<_> = guests.iter().map(|g| g.name.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), guests.len());
        for g in &guests {
            assert!(
                root.join("guest-examples").join(&g.name).is_dir(),
                "{}",
                g.name
            );
        }
    }
}
