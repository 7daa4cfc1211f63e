//! `cargo xtask images`: builds the `flowforge` image from the root
//! `Dockerfile` and the compose stack's service images, all from local
//! bases, so no registry is needed:
//!
//! 1. `flowforge-base:bookworm` — Debian bookworm made with `debootstrap
//!    --variant=minbase` from the host's Debian mirror and imported; only
//!    when the tag is missing (it is the slow step, about a minute).
//! 2. `flowforge-rust:<toolchain>-bookworm` (`containers/rust`) — a
//!    stand-in for the public `rust:<toolchain>-bookworm` builder.
//! 3. `flowforge:latest` and `flowforge:<version>` — the root `Dockerfile`
//!    with its base-image arguments pointed at 1 and 2.
//! 4. `flowforge-postgres:15` and `flowforge-rabbitmq:3`
//!    (`containers/postgres`, `containers/rabbitmq`).
//!
//! Docker's layer cache makes a second run with nothing changed take
//! seconds; the binary is rebuilt only when the crates it is built from
//! change (the build context and the builder stage hold nothing else, not
//! even xtask's code). The CA certificates added to this host
//! (`/usr/local/share/ca-certificates`) are trusted by the build stages
//! that download, so a TLS-intercepting proxy does not break the build;
//! they never reach the shipped images.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::docker::{self, DEBOOTSTRAP};
use crate::project_root;

/// The debootstrapped base every local image starts from.
const BASE_IMAGE: &str = "flowforge-base:bookworm";
/// The image `compose.yaml` runs by default.
pub(crate) const FLOWFORGE_IMAGE: &str = "flowforge:latest";
const POSTGRES_IMAGE: &str = "flowforge-postgres:15";
const RABBITMQ_IMAGE: &str = "flowforge-rabbitmq:3";
/// Debian's own mirror, when the host's sources name none.
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Where this host's added CA certificates are (Debian's convention).
const LOCAL_CA_DIR: &str = "/usr/local/share/ca-certificates";

/// `cargo xtask images [--services]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    match args {
        [] => build(),
        [flag] if flag == "--services" => build_services(),
        [arg, ..] => bail!("images takes only `--services`, got `{arg}`"),
    }
}

/// Builds the base and the service images only: what the integration
/// tests' containers need (the test-support crate starts them), without
/// the slow build of FlowForge's own image.
fn build_services() -> Result<()> {
    let started = Instant::now();
    docker::ensure_daemon()?;
    let root = project_root();
    timed("base image", || ensure_base(&root))?;
    services(&root)?;
    println!(
        "images: service images built in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds every image (see the module documentation).
pub(crate) fn build() -> Result<()> {
    let started = Instant::now();
    docker::ensure_daemon()?;
    let root = project_root();
    timed("base image", || ensure_base(&root))?;

    let toolchain = toolchain(&root)?;
    let rust_image = format!("flowforge-rust:{toolchain}-bookworm");
    let ca = extra_ca_certs()?;
    timed(&rust_image, || {
        docker_build(
            &rust_image,
            &root.join("containers/rust"),
            &[
                ("BASE_IMAGE", BASE_IMAGE),
                ("RUST_VERSION", &toolchain),
                ("EXTRA_CA_CERTS", &ca),
            ],
        )
    })?;

    let version = workspace_version(&root)?;
    let revision = git(&root, &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    let source = git(&root, &["remote", "get-url", "origin"]).unwrap_or_else(|| "unknown".to_owned());
    timed(FLOWFORGE_IMAGE, || {
        docker_build(
            FLOWFORGE_IMAGE,
            &root,
            &[
                ("RUST_IMAGE", &rust_image),
                ("RUNTIME_IMAGE", BASE_IMAGE),
                ("EXTRA_CA_CERTS", &ca),
                ("VERSION", &version),
                ("REVISION", &revision),
                ("SOURCE", &source),
            ],
        )?;
        docker::run(Command::new("docker").args(["tag", FLOWFORGE_IMAGE, &format!("flowforge:{version}")]))
    })?;

    services(&root)?;
    println!("images: built in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The PostgreSQL and RabbitMQ images, on the base image.
fn services(root: &Path) -> Result<()> {
    for (tag, dir) in [
        (POSTGRES_IMAGE, "containers/postgres"),
        (RABBITMQ_IMAGE, "containers/rabbitmq"),
    ] {
        timed(tag, || {
            docker_build(tag, &root.join(dir), &[("BASE_IMAGE", BASE_IMAGE)])
        })?;
    }
    Ok(())
}

/// Runs `step`, printing how long it took.
fn timed(name: &str, step: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("==> {name}");
    let t0 = Instant::now();
    step().with_context(|| format!("building {name}"))?;
    println!("<== {name} in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// `docker build -t tag dir` with the given build arguments.
fn docker_build(tag: &str, dir: &Path, args: &[(&str, &str)]) -> Result<()> {
    let mut command = Command::new("docker");
    // The classic builder takes `FROM` images from the local store and
    // never asks a registry about them, which BuildKit may.
    command
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "--quiet", "--tag", tag]);
    for (name, value) in args {
        command.arg("--build-arg").arg(format!("{name}={value}"));
    }
    command.arg(dir);
    docker::output(&mut command).map(drop)
}

/// Makes the base image unless its tag exists.
fn ensure_base(root: &Path) -> Result<()> {
    if docker::succeeds(Command::new("docker").args(["image", "inspect", BASE_IMAGE])) {
        println!("{BASE_IMAGE} exists");
        return Ok(());
    }
    docker::ensure_tools(&[DEBOOTSTRAP])?;
    let rootfs = root.join("target/containers/rootfs");
    remove_dir(&rootfs)?;
    let mirror = debian_mirror();
    println!("debootstrap bookworm from {mirror}");
    docker::output(
        Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&rootfs)
            .arg(&mirror),
    )?;
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("running tar")?;
    let stream = tar.stdout.take().context("tar's stdout")?;
    let imported = docker::output(Command::new("docker").args(["import", "-", BASE_IMAGE]).stdin(stream));
    let tarred = tar.wait().context("waiting for tar")?;
    imported?;
    if !tarred.success() {
        bail!("tar of {} exited with {tarred}", rootfs.display());
    }
    // The tree is root's and a few hundred megabytes; the image holds it now.
    remove_dir(&rootfs)
}

fn remove_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// The host's Debian bookworm mirror, from its apt sources (one-line or
/// deb822), else Debian's own.
fn debian_mirror() -> String {
    let mut files: Vec<PathBuf> = vec!["/etc/apt/sources.list".into()];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .find_map(|text| mirror_in(&text))
        .unwrap_or_else(|| DEFAULT_MIRROR.to_owned())
}

/// The URI of the first source in `text` that serves the `bookworm` suite
/// itself (not `bookworm-security` or `-updates`).
fn mirror_in(text: &str) -> Option<String> {
    // One-line format: `deb [options] URI SUITE COMPONENTS…`.
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().filter(|w| !w.starts_with('[')).collect();
        if let ["deb", uri, "bookworm", ..] = words.as_slice() {
            return Some((*uri).to_owned());
        }
    }
    // deb822: paragraphs of `Field: value`.
    text.split("\n\n").find_map(|paragraph| {
        let field = |name: &str| {
            paragraph
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
                .map(str::trim)
        };
        let debs = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let bookworm = field("Suites").is_some_and(|s| s.split_whitespace().any(|s| s == "bookworm"));
        (debs && bookworm)
            .then(|| {
                field("URIs")
                    .and_then(|u| u.split_whitespace().next())
                    .map(str::to_owned)
            })
            .flatten()
    })
}

/// The CA certificates added to this host, concatenated (PEM).
fn extra_ca_certs() -> Result<String> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(LOCAL_CA_DIR) {
        Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => return Ok(String::new()),
    };
    files.retain(|f| f.extension().is_some_and(|e| e == "crt"));
    // Sorted, so the build argument, and with it the layer cache, is stable.
    files.sort();
    let mut pem = String::new();
    for file in files {
        pem.push_str(&std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?);
    }
    Ok(pem)
}

/// The toolchain `rust-toolchain.toml` pins (`channel = "…"`).
fn toolchain(root: &Path) -> Result<String> {
    let path = root.join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    quoted_value(&text, "channel").with_context(|| format!("no `channel` in {}", path.display()))
}

/// The workspace version (`version = "…"` under `[workspace.package]`).
fn workspace_version(root: &Path) -> Result<String> {
    let path = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let section = text
        .split("[workspace.package]")
        .nth(1)
        .with_context(|| format!("no [workspace.package] in {}", path.display()))?;
    quoted_value(section, "version").with_context(|| format!("no workspace version in {}", path.display()))
}

/// The value of the first `key = "value"` line of `text`.
fn quoted_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// `git args…` in `root`, trimmed; `None` when git fails.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(root).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bookworm_mirror_is_found_in_either_sources_format() {
        let one_line = "deb http://security.debian.org/debian-security bookworm-security main\n\
                        deb [arch=amd64] http://mirror.example/debian bookworm main contrib\n";
        assert_eq!(mirror_in(one_line).as_deref(), Some("http://mirror.example/debian"));
        let deb822 = "Types: deb\nURIs: http://deb.example/debian-security\nSuites: bookworm-security\n\n\
                      Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(mirror_in(deb822).as_deref(), Some("http://deb.example/debian"));
        assert_eq!(mirror_in("Types: deb-src\nURIs: http://x\nSuites: bookworm\n"), None);
    }

    #[test]
    fn versions_are_read_from_the_manifests() {
        let root = project_root();
        assert!(toolchain(&root).unwrap().starts_with("1."));
        assert!(!workspace_version(&root).unwrap().is_empty());
        assert_eq!(
            quoted_value("a = 1\nchannel = \"1.95.0\"\n", "channel").as_deref(),
            Some("1.95.0")
        );
    }
}
