//! The `curate` binary: parses arguments and calls the library (see `curate::cli`).

fn main() {
    std::process::exit(curate::cli::main());
}
