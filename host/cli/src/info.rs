//! `berth info`: where Berth keeps its sandboxes, the defaults file, and
//! every bound a new sandbox gets where its settings say nothing, with
//! where each comes from.

use berth::backend::limits::HostDefaults;

use crate::home::{berth_home, client};
use crate::table::Table;

/// Prints the home, the defaults file and the defaults in force (as JSON
/// with `json`). A defaults file that cannot be used is the error, as a
/// create would report it.
pub(crate) fn info(json: bool) -> anyhow::Result<()> {
    let home = berth_home()?;
    let file = HostDefaults::path(&home);
    let defaults = HostDefaults::load(&home)?;
    let kinds = client(&home).backend_kinds();
    if json {
        let entries: Vec<_> = defaults
            .entries()
            .into_iter()
            .map(|e| {
                serde_json::json!({
                    "key": e.key, "value": e.value, "from_file": e.from_file, "help": e.help,
                })
            })
            .collect();
        let out = serde_json::json!({
            "home": home,
            "file": file,
            "file_exists": file.exists(),
            "backends": kinds,
            "defaults": entries,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("home      {}", home.display());
    let state = if file.exists() {
        "read at every create"
    } else {
        "absent: Berth's own defaults"
    };
    println!("defaults  {} ({state})", file.display());
    println!("backends  {}", kinds.join(", "));
    println!();
    println!("Bounds a new sandbox gets where its settings say nothing:");
    let mut table = Table::new(&["KEY", "VALUE", "FROM", "BOUNDS"]);
    for entry in defaults.entries() {
        table.row(vec![
            entry.key.to_string(),
            entry.value,
            if entry.from_file {
                "config.toml".into()
            } else {
                "built in".into()
            },
            entry.help.to_string(),
        ]);
    }
    print!("{}", table.render());
    println!();
    println!(
        "Change one for this host under [sandbox] in {} (e.g. memory = \"4GiB\", cpus = 1.5, disk = \"unlimited\"),",
        file.display()
    );
    println!("or for one sandbox with `berth create --memory 4GiB` (`-o KEY=VALUE`).");
    Ok(())
}
