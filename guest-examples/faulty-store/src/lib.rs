//! `faulty-store` (test-only): a remote snapshot client that misbehaves on
//! purpose, chosen by the config key `fault`, so the host's fault handling
//! can be proven: every fault must surface as a typed error within the
//! deadline, and the host must stay healthy.
//!
//! Faults (applied to every operation unless noted): `none`, `trap`,
//! `panic`, `loop`, `recursion`, `memory-bomb`, `huge-error`, `escape`
//! (reads a path outside its grant), `flood-stdout`, `sleep` (blocks in a
//! host call); for `upload` only: `no-read` (returns success without
//! reading), `half-read-error` (reads some, then fails), `ignore-stream-error`
//! (swallows a broken input stream and reports success); `empty-message`
//! (every operation fails with an empty `other` message);
//! `endless-download` (uploads are drained and dropped, `exists` says yes,
//! and `download` writes zeros until the host stops reading).

use std::hint::black_box;
use std::io::Write;

use berth_guest_kit::{config_value, drain_input};

berth_guest_kit::contract_bindings!("berth:snapshot/remote-client-plugin");

use exports::berth::snapshot::remote_client::{
    Client, Config, Guest, GuestClient, InputStream, OutputStream, StorageError,
};

struct Faulty {
    fault: String,
}

#[inline(never)]
fn recurse(n: u64) -> u64 {
    let pad = black_box([n; 64]);
    if n == u64::MAX {
        return pad[0];
    }
    recurse(n + 1).wrapping_add(pad[3])
}

impl Faulty {
    fn misbehave(&self) -> Result<(), StorageError> {
        match self.fault.as_str() {
            "trap" => core::arch::wasm32::unreachable(),
            "panic" => panic!("faulty-store: deliberate panic"),
            "loop" => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            "recursion" => {
                black_box(recurse(0));
                Ok(())
            }
            "memory-bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    let mut block = vec![0u8; 16 << 20];
                    block[0] = 1;
                    hoard.push(black_box(block));
                }
            }
            "empty-message" => Err(StorageError::Other(String::new())),
            "huge-error" => Err(StorageError::Other("E".repeat(16 << 20))),
            "escape" => match std::fs::read("/etc/passwd") {
                Ok(bytes) => Err(StorageError::Other(format!(
                    "ESCAPED: read {} bytes of /etc/passwd",
                    bytes.len()
                ))),
                Err(e) => Err(StorageError::Denied(format!(
                    "cannot read /etc/passwd: {e}"
                ))),
            },
            "flood-stdout" => {
                let line = "flood ".repeat(100);
                let mut out = std::io::stdout();
                for _ in 0..20_000 {
                    let _ = writeln!(out, "{line}");
                }
                Err(StorageError::Other("flooded stdout".into()))
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl GuestClient for Faulty {
    fn open(config: Config) -> Result<Client, StorageError> {
        Ok(Client::new(Faulty {
            fault: config_value(&config, "fault", "none").to_string(),
        }))
    }

    fn upload(&self, _id: String, data: InputStream) -> Result<(), StorageError> {
        match self.fault.as_str() {
            "no-read" => Ok(()),
            "half-read-error" => {
                let _ = data.blocking_read(1024);
                Err(StorageError::Io(
                    "faulty-store: gave up after one read".into(),
                ))
            }
            "ignore-stream-error" => {
                // Reads until the stream ends or breaks, and ignores which.
                while data.blocking_read(65536).is_ok() {}
                Ok(())
            }
            _ => {
                self.misbehave()?;
                drain_input(&data).map_err(|e| StorageError::Io(e.to_string()))?;
                Ok(())
            }
        }
    }

    fn download(&self, id: String, sink: OutputStream) -> Result<(), StorageError> {
        if self.fault == "endless-download" {
            let zeros = [0u8; 4096];
            while sink.blocking_write_and_flush(&zeros).is_ok() {}
            return Err(StorageError::Io(
                "faulty-store: the host stopped reading".into(),
            ));
        }
        self.misbehave()?;
        Err(StorageError::NotFound(format!(
            "faulty-store keeps nothing ({id})"
        )))
    }

    fn exists(&self, _id: String) -> Result<bool, StorageError> {
        self.misbehave()?;
        Ok(self.fault == "endless-download")
    }

    fn delete(&self, id: String) -> Result<(), StorageError> {
        self.misbehave()?;
        Err(StorageError::NotFound(format!(
            "faulty-store keeps nothing ({id})"
        )))
    }
}

struct Component;

impl Guest for Component {
    type Client = Faulty;
}

export!(Component);
