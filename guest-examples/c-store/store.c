// c-store: a Berth remote snapshot client in C (wit-bindgen c + clang).
//
// It behaves like the Rust fs-store: archives live at `<root>/<id>.tar` in a
// directory the host preopened for it; uploads are written under
// `<root>/.partial/` and renamed into place only when complete, so a broken
// upload never replaces the previous archive. Files go through wasi-libc
// (stdio), which the preview1 adapter maps onto wasi:filesystem.
//
// Uploads are the exception to stdio: wasi-libc's preview1 adapter writes a
// file 4 KiB per host call, which capped uploads at ~110 MiB/s. So the
// component is built against `berth:fs-guest/fs-remote-client` (the
// contract's world plus wasi:filesystem@0.2.12, see ../wit-fs) and splices
// the host's archive stream straight into the file's write stream.
//
// Ownership, as wit-bindgen's C bindings define it: an export owns its
// arguments (strings, config, stream handles) and must free or drop them;
// an error string we return is freed by the generated post-return code.

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs_remote_client.h"

typedef exports_berth_snapshot_remote_client_storage_error_t storage_error_t;
typedef wasi_io_streams_stream_error_t stream_error_t;

/// Bytes moved per stream call: amortises the host call, keeps memory flat.
#define CHUNK (256 * 1024)
#define MAX_ID 128
/// Bytes asked for per splice; the host moves what it has.
#define SPLICE (1024 * 1024)

struct exports_berth_snapshot_remote_client_client_t {
    char *root;
};

static char chunk[CHUNK];

// ---- errors ---------------------------------------------------------------

static void set_error(storage_error_t *err, uint8_t tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_error(storage_error_t *err, uint8_t tag, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    err->tag = tag;
    // Every variant carries one string at the same place in the union.
    fs_remote_client_string_dup(&err->val.other, message);
}

/// A failed libc call as a contract error: permission problems are
/// `denied`, the rest `io`.
static void set_errno_error(storage_error_t *err, const char *what) {
    int e = errno;
    uint8_t tag = (e == EACCES || e == EPERM || e == EROFS)
                      ? BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_DENIED
                      : BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO;
    set_error(err, tag, "%s: %s", what, strerror(e));
}

/// Describes a stream failure (and drops the error resource it carries).
static void set_stream_error(storage_error_t *err, const char *what, stream_error_t *se) {
    if (se->tag == WASI_IO_STREAMS_STREAM_ERROR_LAST_OPERATION_FAILED) {
        fs_remote_client_string_t detail;
        wasi_io_error_method_error_to_debug_string(
            wasi_io_error_borrow_error(se->val.last_operation_failed), &detail);
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO, "%s: %.*s", what, (int)detail.len,
                  (const char *)detail.ptr);
        fs_remote_client_string_free(&detail);
    } else {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO, "%s: the stream was closed", what);
    }
    wasi_io_streams_stream_error_free(se);
}

// ---- ids and paths --------------------------------------------------------

/// Checks the contract's id grammar, `[A-Za-z0-9._-]{1,128}` but not `.`
/// or `..`, and copies the id into `out` as a C string.
static bool valid_id(fs_remote_client_string_t *id, char out[MAX_ID + 1],
                     storage_error_t *err) {
    if (id->len == 0 || id->len > MAX_ID) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_INVALID_ID,
                  "snapshot id must be 1 to 128 characters, got %zu", id->len);
        return false;
    }
    for (size_t i = 0; i < id->len; i++) {
        uint8_t c = id->ptr[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) {
            set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_INVALID_ID,
                      "snapshot id contains byte 0x%02x; allowed are A-Z a-z 0-9 . _ -", c);
            return false;
        }
    }
    memcpy(out, id->ptr, id->len);
    out[id->len] = '\0';
    if (strcmp(out, ".") == 0 || strcmp(out, "..") == 0) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_INVALID_ID, "snapshot id \"%s\" is reserved",
                  out);
        return false;
    }
    return true;
}

/// `<root>/<id>.tar` for a valid id; frees the id string either way.
static char *archive_path(struct exports_berth_snapshot_remote_client_client_t *self,
                          fs_remote_client_string_t *snapshot_id, char id[MAX_ID + 1],
                          storage_error_t *err) {
    bool ok = valid_id(snapshot_id, id, err);
    fs_remote_client_string_free(snapshot_id);
    if (!ok) return NULL;
    size_t n = strlen(self->root) + strlen(id) + 6;
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/%s.tar", self->root, id);
    else set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_OTHER, "out of memory");
    return path;
}

// ---- the client resource --------------------------------------------------

bool exports_berth_snapshot_remote_client_static_client_open(
    exports_berth_snapshot_remote_client_config_t *config,
    exports_berth_snapshot_remote_client_own_client_t *ret, storage_error_t *err) {
    const char *root_value = "/data";
    size_t root_len = strlen(root_value);
    for (size_t i = 0; i < config->len; i++) {
        fs_remote_client_string_t *k = &config->ptr[i].f0;
        if (k->len == 4 && memcmp(k->ptr, "root", 4) == 0) {
            root_value = (const char *)config->ptr[i].f1.ptr;
            root_len = config->ptr[i].f1.len;
        }
    }
    char *root = strndup(root_value, root_len);
    exports_berth_snapshot_remote_client_config_free(config);
    if (!root) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_OTHER, "out of memory");
        return false;
    }
    struct stat st;
    if (stat(root, &st) != 0) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_DENIED,
                  "root %s is not reachable (%s); grant it as a preopened directory in the "
                  "plugin manifest",
                  root, strerror(errno));
        free(root);
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_OTHER, "root %s is not a directory", root);
        free(root);
        return false;
    }
    struct exports_berth_snapshot_remote_client_client_t *client = malloc(sizeof *client);
    if (!client) {
        free(root);
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_OTHER, "out of memory");
        return false;
    }
    client->root = root;
    *ret = exports_berth_snapshot_remote_client_client_new(client);
    return true;
}

void exports_berth_snapshot_remote_client_client_destructor(
    exports_berth_snapshot_remote_client_client_t *rep) {
    free(rep->root);
    free(rep);
}

/// Creates the file at `path` (absolute, under a preopened directory;
/// it must not exist yet) for writing through wasi:filesystem.
static bool open_for_splice(const char *path, wasi_filesystem_types_own_descriptor_t *file,
                            storage_error_t *err) {
    wasi_filesystem_preopens_list_tuple2_own_descriptor_string_t dirs;
    wasi_filesystem_preopens_get_directories(&dirs);
    size_t best = dirs.len, best_len = 0;
    for (size_t i = 0; i < dirs.len; i++) {
        const char *base = (const char *)dirs.ptr[i].f1.ptr;
        size_t len = dirs.ptr[i].f1.len;
        while (len > 0 && base[len - 1] == '/') len--;
        if (strncmp(path, base, len) == 0 && path[len] == '/' && (best == dirs.len || len > best_len)) {
            best = i;
            best_len = len;
        }
    }
    bool ok = false;
    if (best == dirs.len) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_DENIED, "%s is not under a preopened directory",
                  path);
    } else {
        const char *rel = path + best_len;
        while (*rel == '/') rel++;
        fs_remote_client_string_t name = {(uint8_t *)rel, strlen(rel)};
        wasi_filesystem_types_error_code_t code;
        ok = wasi_filesystem_types_method_descriptor_open_at(
            wasi_filesystem_types_borrow_descriptor(dirs.ptr[best].f0), 0, &name,
            WASI_FILESYSTEM_TYPES_OPEN_FLAGS_CREATE | WASI_FILESYSTEM_TYPES_OPEN_FLAGS_EXCLUSIVE,
            WASI_FILESYSTEM_TYPES_DESCRIPTOR_FLAGS_WRITE, file, &code);
        if (!ok) {
            set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO,
                      "creating the upload file: wasi:filesystem error code %d", code);
        }
    }
    // The list's free function releases the strings; the descriptors are
    // owned handles and must be dropped one by one.
    for (size_t i = 0; i < dirs.len; i++) wasi_filesystem_types_descriptor_drop_own(dirs.ptr[i].f0);
    wasi_filesystem_preopens_list_tuple2_own_descriptor_string_free(&dirs);
    return ok;
}

/// Creates the file at `path` and splices the host's archive into it until
/// the host closes the stream, then syncs the data. The bytes never enter
/// guest memory.
static bool splice_input(wasi_io_streams_borrow_input_stream_t in, const char *path,
                         storage_error_t *err) {
    wasi_filesystem_types_own_descriptor_t file;
    if (!open_for_splice(path, &file, err)) return false;
    wasi_filesystem_types_borrow_descriptor_t fd = wasi_filesystem_types_borrow_descriptor(file);
    wasi_filesystem_types_error_code_t code;
    wasi_io_streams_own_output_stream_t out;
    bool ok = wasi_filesystem_types_method_descriptor_write_via_stream(fd, 0, &out, &code);
    if (!ok) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO,
                  "writing the upload file: wasi:filesystem error code %d", code);
        wasi_filesystem_types_descriptor_drop_own(file);
        return false;
    }
    wasi_io_streams_borrow_output_stream_t sink = wasi_io_streams_borrow_output_stream(out);
    for (;;) {
        uint64_t moved;
        stream_error_t se;
        if (wasi_io_streams_method_output_stream_blocking_splice(sink, in, SPLICE, &moved, &se)) continue;
        if (se.tag != WASI_IO_STREAMS_STREAM_ERROR_CLOSED) {
            set_stream_error(err, "archive stream failed", &se);
            ok = false;
            break;
        }
        // `closed` is the archive's end, unless the file stream is the side
        // that closed (it only does on a write error).
        uint64_t permit;
        if (!wasi_io_streams_method_output_stream_check_write(sink, &permit, &se)) {
            set_stream_error(err, "writing the upload file", &se);
            ok = false;
        }
        break;
    }
    if (ok) {
        stream_error_t se;
        if (!wasi_io_streams_method_output_stream_blocking_flush(sink, &se)) {
            set_stream_error(err, "writing the upload file", &se);
            ok = false;
        }
    }
    wasi_io_streams_output_stream_drop_own(out);
    if (ok && !wasi_filesystem_types_method_descriptor_sync_data(fd, &code)) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_IO,
                  "syncing the upload file: wasi:filesystem error code %d", code);
        ok = false;
    }
    wasi_filesystem_types_descriptor_drop_own(file);
    return ok;
}

// BACKEND: a real store streams the upload to its service here (granted in
// the manifest's grants.http_hosts) and makes it visible only once the whole
// stream has arrived; download, exists and delete below follow the same rules.
bool exports_berth_snapshot_remote_client_method_client_upload(
    exports_berth_snapshot_remote_client_borrow_client_t self,
    fs_remote_client_string_t *snapshot_id,
    exports_berth_snapshot_remote_client_own_input_stream_t data, storage_error_t *err) {
    char id[MAX_ID + 1];
    char *target = archive_path(self, snapshot_id, id, err);
    if (!target) {
        wasi_io_streams_input_stream_drop_own(data);
        return false;
    }
    size_t n = strlen(self->root) + strlen(id) + 64;
    char *temp = malloc(n);
    bool ok = false;
    if (!temp) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_OTHER, "out of memory");
        goto out;
    }
    snprintf(temp, n, "%s/.partial", self->root);
    if (mkdir(temp, 0755) != 0 && errno != EEXIST) {
        set_errno_error(err, "creating .partial");
        goto out;
    }
    uint64_t nonce = 0;
    if (getentropy(&nonce, sizeof nonce) != 0) {
        set_errno_error(err, "getting randomness for the upload file name");
        goto out;
    }
    snprintf(temp, n, "%s/.partial/%s.%016llx", self->root, id, (unsigned long long)nonce);
    if (!splice_input(wasi_io_streams_borrow_input_stream(data), temp, err)) goto out;
    if (rename(temp, target) != 0) {
        set_errno_error(err, "committing the upload");
        goto out;
    }
    ok = true;
out:
    if (!ok && temp) unlink(temp);
    free(temp);
    free(target);
    wasi_io_streams_input_stream_drop_own(data);
    return ok;
}

/// Copies `file` into the host's stream as fast as it accepts, then flushes.
static bool copy_output(FILE *file, wasi_io_streams_borrow_output_stream_t out,
                        storage_error_t *err) {
    for (;;) {
        uint64_t permit;
        stream_error_t se;
        if (!wasi_io_streams_method_output_stream_check_write(out, &permit, &se)) {
            set_stream_error(err, "the host stopped reading the snapshot", &se);
            return false;
        }
        if (permit == 0) {
            wasi_io_poll_own_pollable_t ready = wasi_io_streams_method_output_stream_subscribe(out);
            wasi_io_poll_method_pollable_block(wasi_io_poll_borrow_pollable(ready));
            wasi_io_poll_pollable_drop_own(ready);
            continue;
        }
        size_t want = permit < CHUNK ? (size_t)permit : CHUNK;
        size_t got = fread(chunk, 1, want, file);
        if (got == 0) {
            if (ferror(file)) {
                set_errno_error(err, "reading the snapshot");
                return false;
            }
            break;
        }
        fs_remote_client_list_u8_t bytes = {(uint8_t *)chunk, got};
        if (!wasi_io_streams_method_output_stream_write(out, &bytes, &se)) {
            set_stream_error(err, "the host stopped reading the snapshot", &se);
            return false;
        }
    }
    stream_error_t se;
    if (!wasi_io_streams_method_output_stream_blocking_flush(out, &se)) {
        set_stream_error(err, "flushing the snapshot", &se);
        return false;
    }
    return true;
}

bool exports_berth_snapshot_remote_client_method_client_download(
    exports_berth_snapshot_remote_client_borrow_client_t self,
    fs_remote_client_string_t *snapshot_id,
    exports_berth_snapshot_remote_client_own_output_stream_t sink, storage_error_t *err) {
    char id[MAX_ID + 1];
    bool ok = false;
    char *path = archive_path(self, snapshot_id, id, err);
    if (path) {
        FILE *file = fopen(path, "rb");
        if (!file && errno == ENOENT) {
            set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_NOT_FOUND, "no snapshot \"%s\"", id);
        } else if (!file) {
            set_errno_error(err, "opening the snapshot");
        } else {
            ok = copy_output(file, wasi_io_streams_borrow_output_stream(sink), err);
            fclose(file);
        }
        free(path);
    }
    wasi_io_streams_output_stream_drop_own(sink);
    return ok;
}

bool exports_berth_snapshot_remote_client_method_client_exists(
    exports_berth_snapshot_remote_client_borrow_client_t self,
    fs_remote_client_string_t *snapshot_id, bool *ret, storage_error_t *err) {
    char id[MAX_ID + 1];
    char *path = archive_path(self, snapshot_id, id, err);
    if (!path) return false;
    struct stat st;
    bool ok = true;
    if (stat(path, &st) == 0) {
        *ret = S_ISREG(st.st_mode);
    } else if (errno == ENOENT) {
        *ret = false;
    } else {
        set_errno_error(err, "checking the snapshot");
        ok = false;
    }
    free(path);
    return ok;
}

bool exports_berth_snapshot_remote_client_method_client_delete(
    exports_berth_snapshot_remote_client_borrow_client_t self,
    fs_remote_client_string_t *snapshot_id, storage_error_t *err) {
    char id[MAX_ID + 1];
    char *path = archive_path(self, snapshot_id, id, err);
    if (!path) return false;
    bool ok = unlink(path) == 0;
    if (!ok && errno == ENOENT) {
        set_error(err, BERTH_SNAPSHOT_TYPES_STORAGE_ERROR_NOT_FOUND, "no snapshot \"%s\"", id);
    } else if (!ok) {
        set_errno_error(err, "deleting the snapshot");
    }
    free(path);
    return ok;
}
