//! Generated workspaces for the round-trip property tests, as shell scripts
//! that run the same in a busybox container and on the host: regular files
//! of many sizes, empty files, sparse files, zeros written out, empty and
//! deep directories, relative, absolute and dangling symlinks, hardlinks,
//! executable and private modes, old times, names with spaces, non-ASCII
//! and 255-byte components. Seeded: the same seed gives the same script.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Quotes `s` for `sh`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

const NAMES: &[&str] = &[
    "a",
    "b.txt",
    "with space",
    "ünïcødé",
    "日本語",
    ".hidden",
    "-dash",
    "x y.tar.gz",
];

fn fresh_name(
    rng: &mut StdRng,
    taken: &mut std::collections::HashSet<String>,
    dir: &str,
) -> String {
    loop {
        let base = if rng.gen_ratio(1, 10) {
            let mut n = format!("long{}-", rng.gen::<u16>());
            while n.len() < 255 {
                n.push('L');
            }
            n
        } else {
            format!(
                "{}{}",
                NAMES[rng.gen_range(0..NAMES.len())],
                rng.gen::<u8>()
            )
        };
        let path = if dir == "." {
            format!("./{base}")
        } else {
            format!("{dir}/{base}")
        };
        if taken.insert(path.clone()) {
            return path;
        }
    }
}

/// The script that builds workspace `seed` in the current directory.
/// `max_file` bounds each file's apparent size.
pub fn script(seed: u64, max_file: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut taken = std::collections::HashSet::new();
    let mut out = vec!["set -e".to_string()];
    let mut dirs = vec![".".to_string()];
    for _ in 0..rng.gen_range(1..8) {
        let parent = dirs[rng.gen_range(0..dirs.len())].clone();
        if parent.matches('/').count() >= 6 {
            continue;
        }
        let d = fresh_name(&mut rng, &mut taken, &parent);
        out.push(format!("mkdir {}", quote(&d)));
        dirs.push(d);
    }
    let mut files = Vec::new();
    for _ in 0..rng.gen_range(1..12) {
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let f = fresh_name(&mut rng, &mut taken, &dir);
        let q = quote(&f);
        let line = match rng.gen_range(0..6) {
            0 => format!(": > {q}"),
            1 => {
                let size = [1u64, 511, 512, 513, 4095, 4096, 4097, 65537][rng.gen_range(0..8)];
                format!("head -c {size} /dev/urandom > {q}")
            }
            2 => {
                let hole = rng.gen_range(1..(max_file / 65536).max(2)) * 65536 / 2;
                let mut l = format!(
                    "truncate -s {hole} {q} && printf 'after the hole' | dd of={q} bs=1 seek={hole} conv=notrunc 2>/dev/null"
                );
                if rng.gen_bool(0.5) {
                    l.push_str(&format!(
                        " && truncate -s {} {q}",
                        hole + 4096 * rng.gen_range(1..16)
                    ));
                }
                l
            }
            3 => format!(
                "truncate -s {} {q}",
                rng.gen_range(1..(max_file / 4096).max(2)) * 4096
            ),
            4 => format!(
                "head -c {} /dev/zero > {q} && printf tail >> {q}",
                rng.gen_range(1..20) * 4096
            ),
            _ => format!(
                "head -c {} /dev/urandom > {q}",
                rng.gen_range(0..max_file.min(2 << 20))
            ),
        };
        out.push(line);
        let mode = ["644", "600", "755", "700", "640", "444"][rng.gen_range(0..6)];
        out.push(format!("chmod {mode} {q}"));
        files.push(f);
    }
    for _ in 0..rng.gen_range(0..4) {
        let target = files[rng.gen_range(0..files.len())].clone();
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let link = fresh_name(&mut rng, &mut taken, &dir);
        out.push(format!("ln -- {} {}", quote(&target), quote(&link)));
    }
    for _ in 0..rng.gen_range(0..5) {
        let dir = dirs[rng.gen_range(0..dirs.len())].clone();
        let link = fresh_name(&mut rng, &mut taken, &dir);
        let target = match rng.gen_range(0..3) {
            0 => {
                let t = &files[rng.gen_range(0..files.len())];
                let ups = "../".repeat(dir.matches('/').count());
                format!("{ups}{}", t.trim_start_matches("./"))
            }
            1 => "/etc/passwd".to_string(),
            _ => "nowhere/at all".to_string(),
        };
        out.push(format!("ln -s -- {} {}", quote(&target), quote(&link)));
    }
    for f in &files {
        out.push(format!(
            "touch -d @{} {}",
            rng.gen_range(0..1_700_000_000u64),
            quote(f)
        ));
    }
    for d in dirs.iter().skip(1).rev() {
        out.push(format!(
            "touch -d @{} {}",
            rng.gen_range(0..1_700_000_000u64),
            quote(d)
        ));
        let mode = ["755", "700", "750"][rng.gen_range(0..3)];
        out.push(format!("chmod {mode} {}", quote(d)));
    }
    out.join("\n")
}

/// A script printing the manifest of the current directory, one line per
/// entry, sorted: type, path, mode, size, link count, mtime and a content
/// hash (files) or the link target (symlinks). The same output from
/// busybox and GNU tools.
pub const MANIFEST: &str = r#"find . -mindepth 1 | LC_ALL=C sort | while IFS= read -r p; do
  if [ -L "$p" ]; then echo "L|$p|$(readlink "$p")";
  elif [ -d "$p" ]; then echo "D|$p|$(stat -c '%a|%Y' "$p")";
  elif [ -f "$p" ]; then echo "F|$p|$(stat -c '%a|%s|%h|%Y' "$p")|$(sha256sum < "$p" | cut -d' ' -f1)";
  else echo "?|$p"; fi
done"#;
