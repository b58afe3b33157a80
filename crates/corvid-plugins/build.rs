//! Links the plugin binary as a fixed-address (non-PIE) executable. A PIE has every
//! pointer in its data relocated at start, which touches each such page: with the
//! Kubernetes client in the binary that was 2 MiB of RSS on every run of every plugin, for
//! code a bridge ADD never calls. Without PIE the linker resolves them once, at build time.
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
