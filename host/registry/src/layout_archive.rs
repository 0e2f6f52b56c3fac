//! `berth plugin save` / `load`: cached plugins as an OCI image layout tar
//! (`oci-layout`, `index.json`, `blobs/sha256/…`), the form `oras` and
//! `skopeo` read, for hosts with no registry.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::cache::BlobCache;
use super::layout::{self, Descriptor, MAX_METADATA_BYTES};
use super::reference::{Digest, OciReference};
use super::RegistryError;

const REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Serialize, Deserialize)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    manifests: Vec<IndexEntry>,
}

#[derive(Serialize, Deserialize)]
struct IndexEntry {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn archive_error(e: std::io::Error) -> RegistryError {
    RegistryError::Io {
        what: "writing the plugin archive".into(),
        source: e,
    }
}

fn append(
    tar: &mut tar::Builder<impl Write>,
    name: &str,
    size: u64,
    data: impl Read,
) -> Result<(), RegistryError> {
    let mut header = tar::Header::new_ustar();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, name, data)
        .map_err(archive_error)
}

pub(crate) fn save(
    cache: &BlobCache,
    references: &[OciReference],
    max: u64,
    out: impl Write,
) -> Result<(), RegistryError> {
    let mut tar = tar::Builder::new(out);
    append(
        &mut tar,
        "oci-layout",
        30,
        &br#"{"imageLayoutVersion":"1.0.0"}"#[..],
    )?;
    let mut index = Index {
        schema_version: 2,
        manifests: Vec::new(),
    };
    let mut written = std::collections::BTreeSet::new();
    for reference in references {
        let digest = reference
            .digest
            .clone()
            .ok_or_else(|| RegistryError::Unpinned {
                reference: reference.to_string(),
            })?;
        let not_cached = || {
            RegistryError::Archive(format!(
                "{reference} is not in the plugin cache; `berth plugin pull {reference}` first"
            ))
        };
        let manifest_bytes = cache
            .read_verified(&digest, MAX_METADATA_BYTES)?
            .ok_or_else(not_cached)?;
        let manifest = layout::check_manifest(&manifest_bytes, None, max).map_err(|reason| {
            RegistryError::Refused {
                reference: reference.to_string(),
                reason,
            }
        })?;
        for blob in [&manifest.config, &manifest.layers[0]] {
            let d = Digest::parse(&blob.digest).map_err(|e| RegistryError::Archive(e.reason))?;
            if !written.insert(d.clone()) {
                continue;
            }
            // Verified on the way out as on the way in.
            let bytes = cache.read_verified(&d, max)?.ok_or_else(not_cached)?;
            append(
                &mut tar,
                &format!("blobs/sha256/{}", d.hex()),
                bytes.len() as u64,
                bytes.as_slice(),
            )?;
        }
        if written.insert(digest.clone()) {
            append(
                &mut tar,
                &format!("blobs/sha256/{}", digest.hex()),
                manifest_bytes.len() as u64,
                manifest_bytes.as_slice(),
            )?;
        }
        let mut annotations = BTreeMap::new();
        annotations.insert(REF_NAME.to_string(), reference.to_string());
        index.manifests.push(IndexEntry {
            media_type: layout::MANIFEST_TYPE.into(),
            digest: digest.to_string(),
            size: manifest_bytes.len() as u64,
            annotations,
        });
    }
    let index = serde_json::to_vec(&index).map_err(|e| RegistryError::Archive(e.to_string()))?;
    append(&mut tar, "index.json", index.len() as u64, index.as_slice())?;
    tar.into_inner()
        .map_err(archive_error)?
        .flush()
        .map_err(archive_error)
}

// Kept as one function: stage, verify every blob, then commit: keeping the
// phases together keeps "nothing is committed before all of it is verified" in
// one place.
pub(crate) fn load(
    cache: &BlobCache,
    input: impl Read,
    max: u64,
) -> Result<Vec<OciReference>, RegistryError> {
    let bad = |m: String| RegistryError::Archive(m);
    let read_io = |e: std::io::Error| RegistryError::Io {
        what: "reading the plugin archive".into(),
        source: e,
    };
    let mut archive = tar::Archive::new(input);
    let mut staged: Vec<(Digest, tempfile::NamedTempFile)> = Vec::new();
    let mut index: Option<Index> = None;
    for entry in archive.entries().map_err(read_io)? {
        let mut entry = entry.map_err(read_io)?;
        let name = entry
            .path()
            .map_err(read_io)?
            .to_string_lossy()
            .into_owned();
        let name = name.trim_start_matches("./").to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(bad(format!(
                "{name}: only regular files belong in a plugin archive"
            )));
        }
        let size = entry.size();
        if name == "oci-layout" {
            continue;
        }
        if name == "index.json" {
            if size > MAX_METADATA_BYTES {
                return Err(bad(format!(
                    "index.json is {size} bytes, over {MAX_METADATA_BYTES}"
                )));
            }
            let mut text = Vec::new();
            entry.read_to_end(&mut text).map_err(read_io)?;
            index = Some(
                serde_json::from_slice(&text)
                    .map_err(|e| bad(format!("index.json is not an OCI index: {e}")))?,
            );
            continue;
        }
        let Some(hex) = name.strip_prefix("blobs/sha256/") else {
            return Err(bad(format!(
                "unexpected entry {name:?}: a plugin archive holds oci-layout, index.json and blobs/sha256/*"
            )));
        };
        let digest =
            Digest::parse(&format!("sha256:{hex}")).map_err(|e| bad(format!("{name}: {e}")))?;
        if size > max {
            return Err(bad(format!(
                "{name} is {size} bytes, over the {max}-byte component limit"
            )));
        }
        let mut temp = cache.temp()?;
        let copied =
            std::io::copy(&mut (&mut entry).take(max + 1), temp.as_file_mut()).map_err(read_io)?;
        if copied != size {
            return Err(bad(format!("{name} is truncated")));
        }
        let got = Digest::of_file(temp.path()).map_err(read_io)?;
        if got != digest {
            return Err(RegistryError::DigestMismatch {
                what: format!("archive entry {name}"),
                expected: digest.to_string(),
                got: got.to_string(),
            });
        }
        staged.push((digest, temp));
    }
    let index = index.ok_or_else(|| bad("no index.json: not an OCI image layout".into()))?;
    let present = |d: &str| staged.iter().any(|(s, _)| s.as_str() == d);
    let mut references = Vec::new();
    for m in &index.manifests {
        if !present(&m.digest) {
            return Err(bad(format!(
                "index.json names {}, which the archive lacks",
                m.digest
            )));
        }
        let Some((_, file)) = staged.iter().find(|(s, _)| s.as_str() == m.digest) else {
            continue;
        };
        let bytes = std::fs::read(file.path()).map_err(read_io)?;
        let manifest =
            layout::check_manifest(&bytes, Some(&m.media_type), max).map_err(|reason| {
                RegistryError::Refused {
                    reference: m.digest.clone(),
                    reason,
                }
            })?;
        let blobs: [&Descriptor; 2] = [&manifest.config, &manifest.layers[0]];
        for b in blobs {
            if !present(&b.digest)
                && !cache.contains(&Digest::parse(&b.digest).map_err(|e| bad(e.reason))?)
            {
                return Err(bad(format!(
                    "manifest {} needs blob {}, which the archive lacks",
                    m.digest, b.digest
                )));
            }
        }
        let digest = Digest::parse(&m.digest).map_err(|e| bad(e.reason))?;
        match m
            .annotations
            .get(REF_NAME)
            .map(|r| r.parse::<OciReference>())
        {
            Some(Ok(r)) if r.digest.as_ref() == Some(&digest) => references.push(r),
            Some(Ok(r)) => references.push(r.pinned(digest)),
            _ => references.push(OciReference {
                registry: "localhost".into(),
                repository: "unnamed".into(),
                tag: None,
                digest: Some(digest),
            }),
        }
    }
    // Everything checked: now keep it.
    for (digest, temp) in staged {
        cache.commit(temp, &digest)?;
    }
    Ok(references)
}
