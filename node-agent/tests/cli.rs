//! corral-agent's own mistakes: one line and a non-zero exit.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_corral-agent"))
        .args(args)
        .output()
        .expect("running corral-agent");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_and_missing_files_are_one_line() {
    let (code, err) = run(&["--sim-gpus", "many"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("corral-agent: error: invalid value 'many'"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, err) = run(&[
        "--name",
        "n",
        "--certs",
        d,
        "--spool",
        d,
        "--socket",
        &format!("{d}/s"),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("corral-agent: error: starting agent"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let gpus = dir.path().join("gpus.toml");
    std::fs::write(&gpus, "[[gpu]]\nindex = 0\n[[gpu]]\nindex = 0\n").unwrap();
    let (code, err) = run(&["--name", "n", "--sim-gpu-file", gpus.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("gpu index 0 repeated"), "{err}");
}

#[test]
fn asking_for_nvml_without_a_driver_is_one_line() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        println!("SKIPPED (an NVIDIA driver is present)");
        return;
    }
    let (code, err) = run(&["--name", "n", "--gpus", "nvml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("corral-agent: error: --gpus nvml: NVML: loading NVML"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
