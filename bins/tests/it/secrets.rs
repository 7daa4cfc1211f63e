//! Passwords in `--db` / `--amqp` (or `FLOWFORGE_DB` / `FLOWFORGE_AMQP`)
//! never reach the terminal: not in `--help` (clap would show the
//! environment's values), not in an error, not in a log line.

use crate::flowforge;

const PLANTED: &str = "pl4nted-s3cret";

/// `flowforge ARGS…` with passwords planted in the environment's URLs
/// (user info and query); returns its stdout and stderr together.
fn printed(args: &[&str], db: &str) -> String {
    let amqp = format!("amqp://ff:{PLANTED}@127.0.0.1:1/%2f?password={PLANTED}");
    let output = flowforge(args)
        .env("FLOWFORGE_DB", db)
        .env("FLOWFORGE_AMQP", &amqp)
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .output()
        .expect("flowforge runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn help_does_not_show_the_environments_passwords() {
    let db = format!("postgres://ff:{PLANTED}@127.0.0.1:1/ff?password={PLANTED}");
    for args in [&["--help"][..], &["worker", "--help"], &["submit", "--help"]] {
        let text = printed(args, &db);
        assert!(text.contains("FLOWFORGE_DB"), "{args:?}: {text}");
        assert!(!text.contains(PLANTED), "{args:?} printed a password:\n{text}");
    }
}

#[test]
fn errors_and_logs_do_not_show_passwords() {
    let unknown_scheme = format!("mysql://ff:{PLANTED}@127.0.0.1:1/ff");
    let not_a_url = format!("ff:{PLANTED}@127.0.0.1");
    let unreachable = format!("postgres://ff:{PLANTED}@127.0.0.1:1/ff?sslmode=disable&password={PLANTED}");
    let cases: [(&[&str], &str, &str); 5] = [
        (&["runs", "list"], &unknown_scheme, "not a store URL"),
        (&["runs", "list"], &not_a_url, "not a store URL"),
        (&["runs", "list"], &unreachable, "error"),
        (&["migrate"], &unreachable, "error"),
        (
            &[
                "worker",
                "--amqp",
                &format!("bogus://ff:{PLANTED}@h/?password={PLANTED}"),
            ],
            &unreachable,
            "AMQP URL",
        ),
    ];
    for (args, db, expected) in cases {
        let text = printed(args, db);
        assert!(text.contains(expected), "{args:?} with {db}: {text}");
        assert!(!text.contains(PLANTED), "{args:?} printed a password:\n{text}");
    }
}
