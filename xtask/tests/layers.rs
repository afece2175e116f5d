//! lockrun's modules import one way: `scripts/layers` finds no import from a lower layer
//! to a higher one, and no circle of imports through two folders (see the layer order
//! declared in the script).

use std::process::Command;

use xtask::root;

#[test]
fn imports_point_down_the_layers_and_circles_stay_in_one_folder() {
    let root = root();
    let out = Command::new("python3")
        .arg(root.join("scripts/layers"))
        .arg(root.join("src"))
        .output()
        .expect("scripts/layers needs python3 (scripts/test installs it)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/layers found imports against the layer order:\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
