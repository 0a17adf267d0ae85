//! `corral sim` is the replay: the multi-call binary hands it to
//! `corral-sim` beside it, output and errors unchanged.

use std::process::Command;

use corral_e2e::bin_dir;

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin_dir().join(bin))
        .args(args)
        .output()
        .expect("running the binary");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn corral_sim_is_corral_sim() {
    let args = ["ml-mix:300", "--nodes", "8", "--json", "-q"];
    let mut a = vec!["sim"];
    a.extend(args);
    let (code, via_corral, err) = run("corral", &a);
    assert_eq!(code, 0, "{err}");
    assert!(via_corral.contains("\"jobs\":300"), "{via_corral}");
    let (code, direct, err) = run("corral-sim", &args);
    assert_eq!(code, 0, "{err}");
    // The same replay gives the same figures, except how long it took.
    let decisions = |json: &str| -> Vec<String> {
        json.trim()
            .split(',')
            .filter(|f| !f.starts_with("\"pass_") && !f.starts_with("\"wall_s"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(decisions(&via_corral), decisions(&direct));
    assert!(decisions(&direct).len() >= 12, "{direct}");
    let (code, _, err) = run("corral", &["sim", "/no/such/trace.swf"]);
    assert_eq!(code, 1);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
