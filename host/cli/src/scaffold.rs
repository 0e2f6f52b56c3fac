//! `berth plugin new`: a working store plugin to start from, in Rust,
//! Python, JavaScript or C. Every file is embedded in the binary (no
//! network, no git clone, no template engine to run): the contract's WIT
//! as this Berth implements it, the language's sources, a build, a
//! manifest granting exactly one directory, and a README.
//!
//! The Python, JavaScript and C sources are the repository's example
//! stores themselves (`guest-examples/`), which the tests build and check;
//! the Rust one stands alone, as the examples lean on an unpublished kit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

/// Arguments of `berth plugin new`.
#[derive(clap::Args)]
pub struct NewArgs {
    /// The plugin's name: lower-case letters, digits and dashes. It is
    /// also the directory created (see --dir).
    pub name: String,
    /// The language: rust, python, js or c.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// The contract world. The templates implement remote-client-plugin
    /// (a store Berth streams archives to).
    #[arg(long, default_value = "remote-client-plugin")]
    pub world: String,
    /// Where to write it. By default, ./NAME.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Overwrite the template's files in an existing directory.
    #[arg(long)]
    pub force: bool,
}

/// A template language.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Lang {
    /// cargo and wit-bindgen.
    Rust,
    /// componentize-py.
    Python,
    /// componentize-js.
    Js,
    /// wit-bindgen c, clang and wasm-tools.
    C,
}

/// The contract and the filesystem world every template builds against.
const WIT: &[(&str, &str)] = &[
    (
        "wit/fs-guest.wit",
        include_str!("../../../guest-examples/wit-fs/fs-guest.wit"),
    ),
    (
        "wit/deps/snapshot.wit",
        include_str!("../../../wit/snapshot.wit"),
    ),
    (
        "wit/deps/io.wit",
        include_str!("../../../wit/deps/io/io.wit"),
    ),
    (
        "wit/deps/clocks.wit",
        include_str!("../../../guest-examples/wit-fs/deps/clocks.wit"),
    ),
    (
        "wit/deps/filesystem.wit",
        include_str!("../../../guest-examples/wit-fs/deps/filesystem.wit"),
    ),
];

/// One file to write: its path in the project and its text (with
/// `{{name}}` and `{{crate}}` replaced).
struct File {
    path: &'static str,
    text: &'static str,
}

struct Template {
    files: &'static [File],
    /// The component the build writes, relative to the project.
    component: &'static str,
    /// What builds it, one command per line.
    build: &'static str,
    /// What the build needs installed.
    needs: &'static str,
}

fn template(lang: Lang) -> Template {
    match lang {
        Lang::Rust => Template {
            files: &[
                File { path: "Cargo.toml", text: include_str!("../templates/rust/Cargo.toml") },
                File { path: "src/lib.rs", text: include_str!("../templates/rust/lib.rs") },
                File { path: ".gitignore", text: "/target\n/store-data\n" },
            ],
            component: "target/wasm32-wasip2/release/{{crate}}.wasm",
            build: "cargo build --release --target wasm32-wasip2",
            needs: "Rust with the wasm32-wasip2 target (rustup target add wasm32-wasip2)",
        },
        Lang::Python => Template {
            files: &[
                File { path: "app.py", text: include_str!("../../../guest-examples/py-store/app.py") },
                File {
                    path: "remote_client.py",
                    text: include_str!("../../../guest-examples/py-store/remote_client.py"),
                },
                File { path: ".gitignore", text: "/{{crate}}.wasm\n/store-data\n__pycache__/\n" },
            ],
            component: "{{crate}}.wasm",
            build: "componentize-py -d wit -w fs-remote-client componentize app -o {{crate}}.wasm",
            needs: "componentize-py 0.25.1 (pip install componentize-py==0.25.1)",
        },
        Lang::Js => Template {
            files: &[
                File { path: "store.js", text: include_str!("../../../guest-examples/js-store/store.js") },
                File { path: "build.mjs", text: include_str!("../templates/js/build.mjs") },
                File { path: "package.json", text: include_str!("../../../guest-examples/js-store/package.json") },
                File {
                    path: "package-lock.json",
                    text: include_str!("../../../guest-examples/js-store/package-lock.json"),
                },
                File { path: ".gitignore", text: "/node_modules\n/{{crate}}.wasm\n/store-data\n" },
            ],
            component: "{{crate}}.wasm",
            build: "npm ci --no-audit --no-fund\nnode build.mjs",
            needs: "Node.js 18+ and npm (componentize-js comes from npm)",
        },
        Lang::C => Template {
            files: &[
                File { path: "store.c", text: include_str!("../../../guest-examples/c-store/store.c") },
                File { path: "build.sh", text: include_str!("../templates/c/build.sh") },
                File { path: ".gitignore", text: "/gen\n/*.core.wasm\n/{{crate}}.wasm\n/store-data\n" },
            ],
            component: "{{crate}}.wasm",
            build: "sh build.sh",
            needs: "clang, lld and wasi-libc (apt-get install clang lld wasi-libc libclang-rt-dev-wasm32), wit-bindgen-cli 0.63 (cargo install wit-bindgen-cli --version 0.63.0) and wasm-tools",
        },
    }
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !name.ends_with('-')
}

fn lang_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "rust",
        Lang::Python => "python",
        Lang::Js => "js",
        Lang::C => "c",
    }
}

pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    if !valid_name(&args.name) {
        bail!(
            "{:?} is not a plugin name: use lower-case letters, digits and dashes, starting with a letter (e.g. my-store)",
            args.name
        );
    }
    if args.world != "remote-client-plugin" {
        bail!(
            "--world {}: the templates implement remote-client-plugin, a store Berth streams archives to \
             (upload, download, exists, delete). A snapshot-plugin owns the whole snapshot; start from \
             guest-examples/dir-snapshot in the Berth repository for one",
            args.world
        );
    }
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    let t = template(args.lang);
    let crate_name = args.name.replace('-', "_");
    let fill = |text: &str| {
        text.replace("{{name}}", &args.name)
            .replace("{{crate}}", &crate_name)
            .replace("berth-js-store", &args.name)
            .replace("../wit-fs", "wit")
    };
    let component = fill(t.component);
    let manifest = format!(
        "# The plugin manifest: what Berth loads and exactly what it grants.\n\
         # Nothing is granted but the directory below; add grants.http_hosts\n\
         # (and the like) only when a real backend needs them.\n\
         name = \"{name}\"\n\
         component = \"{component}\"   # or oci://…@sha256:… after `berth plugin push`\n\
         world = \"remote-client-plugin\"\n\n\
         [config]\n\
         root = \"/data\"\n\n\
         [[grants.dirs]]\n\
         host = \"./store-data\"   # relative to this file; created on first load\n\
         guest = \"/data\"\n\
         mode = \"rw\"\n",
        name = args.name
    );
    let readme = fill(&readme(&args.name, args.lang, &t, &component));
    let mut files: Vec<(String, String)> = WIT
        .iter()
        .map(|(p, text)| (p.to_string(), text.to_string()))
        .collect();
    for f in t.files {
        files.push((f.path.to_string(), fill(f.text)));
    }
    files.push(("berth-plugin.toml".into(), manifest));
    files.push(("README.md".into(), readme));

    if dir.exists() && !args.force {
        let occupied = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some();
        if occupied {
            bail!(
                "{} exists and is not empty; nothing was written. Choose another --dir, or pass --force \
                 to overwrite the template's files in it",
                dir.display()
            );
        }
    }
    for (path, text) in &files {
        write(&dir.join(path), text.as_bytes())?;
    }
    if matches!(args.lang, Lang::C) {
        write(
            &dir.join("wasi_snapshot_preview1.reactor.wasm"),
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    }
    println!(
        "created {} ({}, remote-client-plugin): a working store, granted only ./store-data",
        dir.display(),
        lang_name(args.lang)
    );
    println!("next:");
    println!("  cd {}", dir.display());
    for line in fill(t.build).lines() {
        println!("  {line}");
    }
    println!("  berth plugin check berth-plugin.toml");
    println!(
        "  berth plugin push berth-plugin.toml oci://REGISTRY/plugins/{}:0.1.0",
        args.name
    );
    println!("(the build needs {})", t.needs);
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn readme(name: &str, lang: Lang, t: &Template, component: &str) -> String {
    let source = match lang {
        Lang::Rust => "`src/lib.rs`",
        Lang::Python => "`remote_client.py`",
        Lang::Js => "`store.js`",
        Lang::C => "`store.c`",
    };
    format!(
        "# {name}\n\n\
         A Berth store plugin (`berth:snapshot/remote-client-plugin@0.1.0`) in {lang}, made by\n\
         `berth plugin new`. It already works: it keeps each snapshot as `<id>.tar` in the\n\
         directory its manifest grants (`./store-data`, seen by the plugin as `/data`),\n\
         and an upload becomes visible only when it is complete.\n\n\
         The places to put a real backend are marked `BACKEND:` in {source}.\n\n\
         ## Build\n\n\
         Needs {needs}.\n\n\
         ```sh\n{build}\n```\n\n\
         It writes `{component}`, which `berth-plugin.toml` names.\n\n\
         ## Check\n\n\
         ```sh\n\
         berth plugin check berth-plugin.toml\n\
         ```\n\n\
         runs the contract's conformance suite clause by clause (`--large-size 64MiB`\n\
         shortens the streamed round trip).\n\n\
         ## Push, and use it by reference\n\n\
         ```sh\n\
         berth plugin push berth-plugin.toml oci://REGISTRY/plugins/{name}:0.1.0\n\
         ```\n\n\
         prints `oci://REGISTRY/plugins/{name}:0.1.0@sha256:…`. Put that in a manifest's\n\
         `component` and any host loads these exact bytes (fetched once, then from its\n\
         cache). A registry on plain HTTP must be listed in `BERTH_REGISTRY_PLAIN_HTTP`;\n\
         credentials come from the docker config (`docker login`).\n\n\
         ## Files\n\n\
         - `wit/`: the contract (`deps/snapshot.wit`) and the world the build uses\n\
           (`fs-guest.wit`: the contract plus `wasi:filesystem`).\n\
         - `berth-plugin.toml`: the manifest; it grants the one directory and nothing else.\n",
        lang = match lang {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
            Lang::C => "C",
        },
        needs = t.needs,
        build = t.build,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["my-store", "s3", "a-b-c1"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "My", "1x", "a_b", "a-", "a/b", "../x"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
