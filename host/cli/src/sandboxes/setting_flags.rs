//! A backend kind's settings as `berth create` flags, from the kinds'
//! own [`SettingDoc`]s: `--memory 2GiB` is `-o memory=2GiB`, `--no-agent`
//! is `-o agent=false`, for every key any registered kind takes (and its
//! aliases). The CLI names no kind's settings: a new setting or kind
//! gets its flags, and its help, from its module.

use berth::backend::SettingDoc;

/// The kinds' settings, for flags and help.
pub(crate) type KindDocs = Vec<(String, Vec<SettingDoc>)>;

/// Rewrites `berth create`'s setting flags in `args` (the whole command
/// line) into `-o KEY=VALUE`. `own` are create's own long flags, left
/// alone; everything after `--` is too.
pub(crate) fn expand(args: Vec<String>, docs: &KindDocs, own: &[String]) -> Vec<String> {
    // `create`, or `pool create`, as the first word that is not a flag.
    let Some(at) = args
        .iter()
        .skip(1)
        .position(|a| !a.starts_with('-'))
        .map(|i| i + 1)
        .and_then(|i| match args[i].as_str() {
            "create" => Some(i),
            "pool" if args.get(i + 1).is_some_and(|a| a == "create") => Some(i + 1),
            _ => None,
        })
    else {
        return args;
    };
    let doc_of = |key: &str| {
        docs.iter()
            .flat_map(|(_, docs)| docs)
            .find(|d| d.key == key || d.aliases.contains(&key))
            .cloned()
    };
    let mut out: Vec<String> = args[..=at].to_vec();
    let mut rest = args[at + 1..].iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(rest.cloned());
            break;
        }
        let Some(flag) = arg.strip_prefix("--") else {
            out.push(arg.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (flag, None),
        };
        if own.iter().any(|o| o == name) {
            out.push(arg.clone());
            continue;
        }
        let key = name.replace('-', "_");
        let negated = key
            .strip_prefix("no_")
            .and_then(|k| doc_of(k).filter(|d| d.value == "BOOL"));
        // The key is kept as given (an alias is one the kind accepts too);
        // `--no-KEY` names the doc's key.
        let (doc, key, value) = match (doc_of(&key), negated, inline) {
            (Some(doc), _, Some(value)) => (doc, key, value),
            (Some(doc), _, None) if doc.value == "BOOL" => (doc, key, "true".to_string()),
            (Some(doc), _, None) => match rest.next() {
                Some(value) => (doc, key, value.clone()),
                // clap says the value is missing.
                None => {
                    out.push(arg.clone());
                    continue;
                }
            },
            (None, Some(doc), None) => {
                let key = doc.key.to_string();
                (doc, key, "false".to_string())
            }
            _ => {
                out.push(arg.clone());
                continue;
            }
        };
        out.push("-o".into());
        out.push(format!("{key}={}", absolute_if_path(&doc, value)));
    }
    out
}

/// A `PATH` value made absolute from the current directory, so that it
/// means what the user meant wherever the sandbox is created.
pub(crate) fn absolute_if_path(doc: &SettingDoc, value: String) -> String {
    if doc.value != "PATH" || value.is_empty() {
        return value;
    }
    std::path::absolute(&value)
        .map(|p| p.display().to_string())
        .unwrap_or(value)
}

/// The settings each kind takes, for `berth create --help`, wrapped at
/// 100 columns.
pub(crate) fn help(docs: &KindDocs) -> String {
    let mut text = String::from(
        "Backend settings (-o KEY=VALUE, or --KEY VALUE; --no-KEY for a BOOL; repeat a key for a list):\n",
    );
    for (kind, docs) in docs {
        text.push_str(&format!("\n  --backend {kind}\n"));
        if docs.is_empty() {
            text.push_str("      (no settings)\n");
        }
        for doc in docs {
            let head = format!(
                "      {}={}{}",
                doc.key,
                doc.value,
                if doc.required { " (required)" } else { "" }
            );
            text.push_str(&head);
            text.push('\n');
            let mut line = String::from("          ");
            for word in doc.help.split_whitespace() {
                if line.len() + word.len() + 1 > 100 && !line.trim().is_empty() {
                    text.push_str(line.trim_end());
                    text.push('\n');
                    line = String::from("          ");
                }
                line.push_str(word);
                line.push(' ');
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs() -> KindDocs {
        vec![
            (
                "local".into(),
                vec![SettingDoc::optional("root_dir", "PATH", "dir")],
            ),
            (
                "docker".into(),
                vec![
                    SettingDoc::required("image", "IMAGE", "img"),
                    SettingDoc::optional("agent", "BOOL", "agent"),
                    SettingDoc::optional("run_args", "ARG", "args").aliases(&["run_arg"]),
                ],
            ),
        ]
    }

    fn expanded(line: &str) -> String {
        let args = line.split(' ').map(String::from).collect();
        expand(args, &docs(), &["backend".into(), "json".into()]).join(" ")
    }

    #[test]
    fn setting_flags_become_options() {
        assert_eq!(
            expanded(
                "berth create a --backend docker --image x --no-agent --run-arg=--cap-add --json"
            ),
            "berth create a --backend docker -o image=x -o agent=false -o run_arg=--cap-add --json"
        );
        assert_eq!(
            expanded("berth --no-server create a --agent --unknown 3 -- --image"),
            "berth --no-server create a -o agent=true --unknown 3 -- --image"
        );
        assert_eq!(expanded("berth exec a --image x"), "berth exec a --image x");
        assert_eq!(
            expanded("berth pool create py --backend docker --image x --size 3"),
            "berth pool create py --backend docker -o image=x --size 3"
        );
        assert_eq!(
            expanded("berth pool ls --image x"),
            "berth pool ls --image x"
        );
        let abs = expanded("berth create a --root-dir ws");
        assert!(
            abs.starts_with("berth create a -o root_dir=/") && abs.ends_with("/ws"),
            "{abs}"
        );
    }

    #[test]
    fn help_lists_every_kind() {
        let h = help(&docs());
        assert!(
            h.contains("--backend local") && h.contains("image=IMAGE (required)"),
            "{h}"
        );
    }
}
