//! The test kit runs the binary cargo built for these tests: the `seatboard`
//! it finds beside the running test binary is the one `CARGO_BIN_EXE_seatboard`
//! names.

use testkit::common;

#[test]
fn built_bin_is_the_one_cargo_built_for_the_tests() {
    let expected = std::path::Path::new(env!("CARGO_BIN_EXE_seatboard"));
    assert_eq!(common::built_bin(), expected);
    assert!(expected.is_file(), "{} is not a file", expected.display());
}
