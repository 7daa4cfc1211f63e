//! The browser-test harness for the web UI (issue 13): Debian's
//! `chromium`, headless, behind a `chromedriver` each test starts on a
//! free port, driven with fantoccini over plain http.
//!
//! Without chromedriver or chromium, or when they cannot start, a test
//! returns early with a notice, unless `REQUIRE_BROWSER=1` (set by
//! `.ci/run`) makes that a failure. Every wait polls a condition under
//! [`PATIENCE`] and fails with the page's URL and source; nothing sleeps
//! to synchronise.
//!
//! Screenshots: [`save_screenshot`] writes `<name>.png` into
//! `FLOWFORGE_SCREENSHOTS` (`cargo xtask screenshots` points it at
//! `docs/screenshots` for the tests named `…screenshot…`), else into a
//! temporary folder.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long a wait for the page may take before the test fails: generous,
/// so a loaded CI machine does not fail a correct UI.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Between two looks at a condition.
const POLL: Duration = Duration::from_millis(50);

/// How much of the page source a failure shows.
const SOURCE_SNIPPET: usize = 3000;

/// Chromium's arguments besides the profile folder. `--no-sandbox`: CI
/// runs as root, where chromium refuses its sandbox; `--disable-dev-shm-usage`:
/// containers' small `/dev/shm` crashes tabs; `--disable-gpu`: there is none;
/// a fixed window size, so layouts and screenshots do not depend on the machine.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1400,1000",
];

/// The first eight bytes of every PNG file.
const PNG_MAGIC: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// A headless chromium session of this test's own.
#[derive(Debug)]
pub(crate) struct Browser {
    client: Client,
    /// `None` once [`Browser::close`] has stopped it.
    driver: Option<Child>,
    /// chromedriver's output, shown when it fails.
    driver_log: PathBuf,
    /// Removed after the browser is gone: its profile and the log.
    dir: TempDir,
}

impl Browser {
    /// Starts chromedriver and a chromium session; `None` (after a notice)
    /// when they are missing or cannot start, a panic instead under
    /// `REQUIRE_BROWSER=1`.
    pub(crate) async fn start() -> Option<Self> {
        let Some(chromedriver) = find("chromedriver") else {
            return absent("chromedriver is not installed (neither on PATH nor /usr/bin)");
        };
        let Some(chromium) = find("chromium") else {
            return absent("chromium is not installed (neither on PATH nor /usr/bin)");
        };
        let dir = tempfile::Builder::new()
            .prefix("ff-browser-")
            .tempdir()
            .expect("a temp folder");
        let driver_log = dir.path().join("chromedriver.log");
        let (driver, port) = match start_driver(&chromedriver, &driver_log).await {
            Ok(started) => started,
            Err(why) => return absent(&why),
        };
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| (*a).to_owned()).collect();
        // A profile per test: parallel tests never share cookies, storage
        // or chromium's profile lock.
        args.push(format!("--user-data-dir={}", dir.path().join("profile").display()));
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({ "binary": chromium, "args": args }),
        );
        let connecting = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await;
        let client = match connecting {
            Ok(client) => client,
            Err(e) => {
                stop(driver);
                let log = std::fs::read_to_string(&driver_log).unwrap_or_default();
                return absent(&format!(
                    "chromedriver could not start {} ({e}); its log:\n{log}",
                    chromium.display()
                ));
            }
        };
        Some(Self {
            client,
            driver: Some(driver),
            driver_log,
            dir,
        })
    }

    /// The fantoccini session, for what the helpers below do not cover
    /// (typing, forms, windows).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Ends the session, then chromedriver. Dropping a `Browser` kills
    /// both too, but cannot tell chromedriver to quit chromium first.
    pub(crate) async fn close(mut self) {
        // Bounded: a wedged browser must not hang the test; the kill below
        // ends it anyway.
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
        if let Some(driver) = self.driver.take() {
            stop(driver);
        }
    }

    /// Navigates to `url` and waits for its load event.
    pub(crate) async fn goto(&self, url: &str) {
        if let Err(e) = self.client.goto(url).await {
            return self.fail(&format!("could not open {url}: {e}")).await;
        }
    }

    /// Reloads the page.
    pub(crate) async fn refresh(&self) {
        if let Err(e) = self.client.refresh().await {
            return self.fail(&format!("could not reload the page: {e}")).await;
        }
    }

    /// The first element matching `css`, once there is one.
    pub(crate) async fn wait_for(&self, css: &str) -> Element {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => return element,
                Err(e) if e.is_invalid_selector() => self.fail(&format!("`{css}` is not a CSS selector: {e}")).await,
                Err(e) if Instant::now() >= deadline => {
                    self.fail(&format!("nothing matched `{css}` within {PATIENCE:?} ({e})"))
                        .await
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Waits until the JavaScript expression `script` is truthy; `what`
    /// says what that means, for the failure message.
    pub(crate) async fn wait_until_js(&self, script: &str, what: &str) {
        let body = format!("return !!({script});");
        let deadline = Instant::now() + PATIENCE;
        loop {
            // A script error counts as not yet: the expression may read
            // what the page has not rendered.
            let last = match self.client.execute(&body, vec![]).await {
                Ok(Value::Bool(true)) => return,
                Ok(value) => value.to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return self
                    .fail(&format!(
                        "waited {PATIENCE:?} for {what}: `{script}` is still not truthy (last: {last})"
                    ))
                    .await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Attribute `name` of the first element matching `css` (waited for);
    /// `None` when the element has no such attribute.
    pub(crate) async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.retry(&format!("attribute `{name}` of `{css}`"), || async move {
            self.wait_for(css).await.attr(name).await
        })
        .await
    }

    /// Runs `script` (a function body: it `return`s its value) with
    /// `arguments` bound to `args`.
    pub(crate) async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        match self.client.execute(script, args).await {
            Ok(value) => value,
            Err(e) => self.fail(&format!("script failed: {e}\n{script}")).await,
        }
    }

    /// Clicks the first element matching `css` (waited for).
    pub(crate) async fn click(&self, css: &str) {
        self.retry(&format!("a click on `{css}`"), || async move {
            self.wait_for(css).await.click().await
        })
        .await;
    }

    /// Types `keys` (WebDriver key codes included, e.g. `\u{e015}` for
    /// ArrowDown) into the element that has the focus.
    pub(crate) async fn keys(&self, keys: &str) {
        let sent = match self.client.active_element().await {
            Ok(element) => element.send_keys(keys).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            self.fail::<()>(&format!("could not type {keys:?}: {e}")).await;
        }
    }

    /// A PNG of the viewport.
    pub(crate) async fn screenshot_png(&self) -> Vec<u8> {
        match self.client.screenshot().await {
            Ok(png) => {
                assert_png(&png);
                png
            }
            Err(e) => self.fail(&format!("no screenshot: {e}")).await,
        }
    }

    /// `op` until it succeeds: between finding an element and acting on it
    /// the UI may re-render it (stale) or still cover or disable it.
    async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, CmdError>>,
    {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match op().await {
                Ok(value) => return value,
                Err(e) if Instant::now() >= deadline => {
                    self.fail(&format!("{what} kept failing for {PATIENCE:?}: {e}")).await
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Panics with `message`, the page's URL and the start of its source.
    async fn fail<T>(&self, message: &str) -> T {
        let url = match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => format!("(unknown: {e})"),
        };
        let source = match self.client.source().await {
            Ok(source) => source.chars().take(SOURCE_SNIPPET).collect(),
            Err(e) => format!("(unavailable: {e})"),
        };
        let log = std::fs::read_to_string(&self.driver_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let log_tail = lines[lines.len().saturating_sub(20)..].join("\n");
        panic!("{message}\nat {url}\npage source (start):\n{source}\nchromedriver log (end):\n{log_tail}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.take() {
            stop(driver);
        }
    }
}

/// Kills chromedriver and the chromium it started. chromedriver leads its
/// own process group (see [`start_driver`]) and chromium stays in it, so
/// one signal ends both even when the session was not closed; the group's
/// id cannot be reused before `wait` below reaps its leader.
fn stop(mut driver: Child) {
    // Never group 0 or 1 (this process's own group, or every process): only
    // the group this harness created, whose leader is the child.
    if let Ok(pid) = i32::try_from(driver.id())
        && pid > 1
    {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = driver.kill();
    let _ = driver.wait();
}

/// Starts chromedriver on a free port and waits until it says it is ready;
/// returns it and the port, or why not.
async fn start_driver(chromedriver: &Path, log: &Path) -> Result<(Child, u16), String> {
    // Another process may take the free port before chromedriver binds it:
    // then chromedriver exits, and another port is tried.
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port();
        let out = std::fs::File::create(log).expect("a log file");
        let err = out.try_clone().expect("a log file");
        let mut driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group, which chromium joins: see `stop`.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("{} did not start: {e}", chromedriver.display()))?;
        let deadline = Instant::now() + PATIENCE;
        loop {
            if driver_ready(port).await {
                return Ok((driver, port));
            }
            if let Ok(Some(status)) = driver.try_wait() {
                last = format!(
                    "{} exited ({status}) on port {port}:\n{}",
                    chromedriver.display(),
                    std::fs::read_to_string(log).unwrap_or_default(),
                );
                break;
            }
            if Instant::now() >= deadline {
                stop(driver);
                return Err(format!(
                    "{} did not answer /status within {PATIENCE:?}:\n{}",
                    chromedriver.display(),
                    std::fs::read_to_string(log).unwrap_or_default()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
    Err(last)
}

/// Whether chromedriver on `port` answers `/status` with `ready: true`.
async fn driver_ready(port: u16) -> bool {
    let answer = crate::http_client()
        .get(format!("http://127.0.0.1:{port}/status"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    let Ok(answer) = answer else { return false };
    answer
        .json::<Value>()
        .await
        .is_ok_and(|status| status["value"]["ready"] == json!(true))
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port()
}

/// The executable `name` on PATH, else in /usr/bin (Debian's place for
/// both, which a minimal PATH may lack).
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// No browser: `None` after a notice, or a panic under `REQUIRE_BROWSER=1`.
fn absent(why: &str) -> Option<Browser> {
    assert!(
        std::env::var("REQUIRE_BROWSER").as_deref() != Ok("1"),
        "REQUIRE_BROWSER=1 but {why}; install Debian's chromium and chromium-driver (.ci/run does)"
    );
    flowforge_testkit::notice(&format!(
        "SKIPPED: {why}; install chromium and chromium-driver (and set REQUIRE_BROWSER=1 to fail instead)"
    ));
    None
}

/// Panics unless `bytes` start like a PNG file.
fn assert_png(bytes: &[u8]) {
    assert!(
        bytes.starts_with(&PNG_MAGIC),
        "not a PNG: starts with {:02x?}",
        &bytes[..bytes.len().min(8)]
    );
}

/// Writes a screenshot as `<name>.png` into `FLOWFORGE_SCREENSHOTS` when
/// set (`cargo xtask screenshots`: the committed `docs/screenshots`), else
/// into `flowforge-screenshots` in the temp folder, to look at; returns
/// the path.
pub(crate) fn save_screenshot(name: &str, png: &[u8]) -> PathBuf {
    assert_png(png);
    assert!(
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "a screenshot name is a plain file stem ([A-Za-z0-9_-]), got `{name}`"
    );
    let dir = std::env::var_os("FLOWFORGE_SCREENSHOTS")
        .map_or_else(|| std::env::temp_dir().join("flowforge-screenshots"), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    flowforge_testkit::notice(&format!("screenshot: {}", path.display()));
    path
}

/// `html` as a `data:` URL.
fn data_url(html: &str) -> String {
    let mut url = String::from("data:text/html;charset=utf-8,");
    for byte in html.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

/// The PNG's width and height, from its header chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    let word = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("four bytes"));
    (word(16), word(20))
}

#[tokio::test]
async fn the_browser_harness_drives_a_page() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    // The click marks the body only later, so the harness has to wait for
    // it rather than find it already there.
    let page = data_url(
        "<!doctype html><title>harness</title>\
         <button id=go onclick=\"setTimeout(() => document.body.dataset.clicked = 'yes', 300)\">Go</button>",
    );
    browser.goto(&page).await;
    browser.wait_for("#go").await;
    assert_eq!(browser.attr("body", "data-clicked").await, None);

    browser.click("#go").await;
    browser
        .wait_until_js("document.body.dataset.clicked === 'yes'", "the click to mark the body")
        .await;
    assert_eq!(browser.attr("body", "data-clicked").await.as_deref(), Some("yes"));
    assert_eq!(browser.js("return arguments[0] + 1;", vec![json!(41)]).await, json!(42));
    assert_eq!(browser.client().title().await.expect("a title"), "harness");

    let png = browser.screenshot_png().await;
    let (width, height) = png_size(&png);
    assert!(
        width >= 1000 && height >= 700,
        "--window-size=1400,1000 is not in effect: the viewport is {width}×{height}"
    );
    // Under `cargo xtask screenshots` the folder is the committed one,
    // which is no place for this page.
    if std::env::var_os("FLOWFORGE_SCREENSHOTS").is_none() {
        let saved = save_screenshot("browser-harness", &png);
        assert_eq!(std::fs::read(&saved).expect("the saved screenshot"), png);
    }

    // A reload starts the page over: the mark is gone.
    browser.refresh().await;
    browser.wait_for("#go").await;
    assert_eq!(browser.attr("body", "data-clicked").await, None);

    browser.close().await;
}

/// The processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            // A zombie's command line is empty: it is gone but for its exit status.
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(cmdline)
        })
        .collect()
}

#[tokio::test]
async fn the_browser_harness_kills_chromium_when_dropped() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    browser.goto(&data_url("<!doctype html><title>dropped</title>")).await;
    // The profile folder is this session's own: only its chromium names it.
    let profile = format!("--user-data-dir={}", browser.dir.path().join("profile").display());
    assert!(
        !processes_mentioning(&profile).is_empty(),
        "no chromium process runs with {profile}"
    );
    // What a failing test does: no `close`, only the drop while unwinding.
    drop(browser);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = processes_mentioning(&profile);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chromium outlived its Browser by {PATIENCE:?}:\n{}",
            left.join("\n")
        );
        tokio::time::sleep(POLL).await;
    }
}
