//! The S3 store (Garage) against the plain S3 API.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use berth::plugin::PluginHost;
use berth::RemoteSnapshotClient;

/// Berth side by side with GNU tar, the docker CLI and boto3.
use super::*;

/// s3-store against boto3 on the same S3 store (the Garage cluster that
/// `cargo xtask setup` starts, described by /tmp/berth-garage/s3.env).
/// The Garage test cluster's credentials (from `cargo xtask setup`).
pub(super) struct S3Creds {
    pub(super) endpoint: String,
    pub(super) region: String,
    pub(super) bucket: String,
    pub(super) key: String,
    pub(super) secret: String,
}

pub(super) fn s3_creds() -> anyhow::Result<S3Creds> {
    let text = std::fs::read_to_string("/tmp/berth-garage/s3.env")
        .context("no /tmp/berth-garage/s3.env")?;
    let env: std::collections::HashMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        env.get(k)
            .map(|v| v.to_string())
            .with_context(|| format!("{k} missing"))
    };
    Ok(S3Creds {
        endpoint: get("BERTH_S3_ENDPOINT")?,
        region: get("BERTH_S3_REGION")?,
        bucket: get("BERTH_S3_BUCKET")?,
        key: get("BERTH_S3_ACCESS_KEY_ID")?,
        secret: get("BERTH_S3_SECRET_ACCESS_KEY")?,
    })
}

/// Writes an s3-store manifest for the Garage cluster, objects under
/// `prefix`.
pub(super) fn s3_manifest(base: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let component = std::path::absolute(guest_table::component_path(
        &std::env::current_dir()?,
        &guest_table::guest(&std::env::current_dir()?, "s3-store").map_err(anyhow::Error::msg)?,
    ))?;
    if !component.is_file() {
        bail!("s3-store is not built");
    }
    let manifest = base.join(format!("s3-store-{}.toml", prefix.trim_end_matches('/')));
    std::fs::write(
        &manifest,
        format!(
            "component = {component:?}\nworld = 'remote-client-plugin'\n[config]\nendpoint = {endpoint:?}\nregion = {region:?}\n\
             bucket = {bucket:?}\nprefix = {prefix:?}\naccess_key_id = {key:?}\nsecret_access_key = {secret:?}\n\
             [grants]\nmax_memory = '64MiB'\ndeadline_secs = 1800\nwall_clock = true\nhttp_hosts = [{endpoint:?}]\n"
        ),
    )?;
    Ok(manifest)
}

/// Deletes every object under `prefix` in the Garage bucket (boto3), so
/// benchmark runs do not fill the disk.
pub(super) fn s3_clear(prefix: &str) -> anyhow::Result<()> {
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let script = format!(
        r#"
import boto3
s3 = boto3.client("s3", endpoint_url="{endpoint}", region_name="{region}",
                  aws_access_key_id="{key}", aws_secret_access_key="{secret}")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="{bucket}", Prefix="{prefix}"):
    objs = page.get("Contents", [])
    if objs:
        s3.delete_objects(Bucket="{bucket}", Delete={{"Objects": [{{"Key": o["Key"]}} for o in objs]}})
"#
    );
    let out = Command::new("python3").arg("-c").arg(&script).output()?;
    if !out.status.success() {
        bail!("boto3: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub(super) async fn s3_rows(base: &Path, runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    let manifest = s3_manifest(base, "bench/")?;
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let client = PluginHost::new()?
        .load_file(&manifest)
        .await?
        .remote_client()?;
    let size: u64 = if quick { 16 << 20 } else { 256 << 20 };
    let data = base.join("s3-blob");
    {
        let mut f = std::fs::File::create(&data)?;
        let mut chunk = vec![0u8; 1 << 20];
        for i in 0..(size >> 20) {
            fill(&mut chunk, i);
            std::io::Write::write_all(&mut f, &chunk)?;
        }
    }
    let script = format!(
        r#"
import boto3, sys, time
s3 = boto3.client("s3", endpoint_url="{endpoint}", region_name="{region}",
                  aws_access_key_id="{key}", aws_secret_access_key="{secret}")
t = time.time(); s3.upload_file(sys.argv[1], "{bucket}", "bench/boto3.tar"); up = time.time() - t
t = time.time(); s3.download_file("{bucket}", "bench/boto3.tar", sys.argv[1] + ".down"); down = time.time() - t
print(up, down)
"#
    );
    let (mut ours_up, mut ours_down, mut boto_up, mut boto_down) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        let mut f = tokio::fs::File::open(&data).await?;
        client.upload("bench-s3", &mut f).await?;
        ours_up.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut out = tokio::fs::File::create(base.join("s3-down")).await?;
        client.download("bench-s3", &mut out).await?;
        ours_down.push(t.elapsed().as_secs_f64());
        let out = Command::new("python3")
            .arg("-c")
            .arg(&script)
            .arg(&data)
            .output()?;
        if !out.status.success() {
            bail!("boto3 failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text
            .split_whitespace()
            .filter_map(|v| v.parse::<f64>().ok());
        boto_up.push(it.next().unwrap_or(f64::NAN));
        boto_down.push(it.next().unwrap_or(f64::NAN));
    }
    let (ou, od, bu, bd) = (
        median(ours_up),
        median(ours_down),
        median(boto_up),
        median(boto_down),
    );
    Ok(vec![
        Row {
            group: "s3",
            name: format!(
                "upload {} MiB (s3-store, multipart 8 MiB parts)",
                size >> 20
            ),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(size, ou), ou),
            baseline: format!("boto3 {:.2}s", bu),
            ratio: Some(ou / bu),
        },
        Row {
            group: "s3",
            name: format!("download {} MiB (s3-store)", size >> 20),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(size, od), od),
            baseline: format!("boto3 {:.2}s", bd),
            ratio: Some(od / bd),
        },
    ])
}
