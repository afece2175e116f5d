//! The shape of lockrun's source, checked by two scripts: `scripts/layers` finds no
//! import from a lower layer to a higher one, none between two backends, and no circle
//! of imports through two folders (see the layer order declared in the script);
//! `scripts/sizes` finds no file over 500 lines and no function over 60.

use std::process::Command;

use xtask::root;

/// Runs `scripts/NAME` on `src/`; panics with its report (saying `what`) if it fails.
fn check(name: &str, what: &str) {
    let root = root();
    let out = Command::new("python3")
        .arg(root.join("scripts").join(name))
        .arg(root.join("src"))
        .output()
        .unwrap_or_else(|e| panic!("scripts/{name} needs python3 (scripts/test installs it): {e}"));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/{name} found {what}:\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn imports_point_down_the_layers_and_circles_stay_in_one_folder() {
    check("layers", "imports against the layer order");
}

#[test]
fn files_and_functions_fit_on_a_screen() {
    check("sizes", "files or functions too long");
}
