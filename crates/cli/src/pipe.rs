//! Output into a closed pipe (`mtswarm watch ID --json | head -1`) ends a
//! command quietly with success, as Unix tools do: the reader has what it
//! wanted. Rust ignores SIGPIPE, so a write to a closed pipe fails with
//! `EPIPE` instead of ending the process: as an error of a command that
//! writes through a `Write` (mapped by [`is_closed_pipe`] in
//! [`crate::run`]), or as the panic of `println!` (caught by the hook
//! [`install_hook`] installs, which exits 0 instead of printing a
//! backtrace). Every other panic goes to the previous hook unchanged.

use std::io;

/// True when `error` comes from a write into a closed pipe.
pub(crate) fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<io::Error>())
        .any(|io| io.kind() == io::ErrorKind::BrokenPipe)
}

/// The message std's `print!` family panics with when stdout's pipe is
/// closed: "failed printing to stdout: Broken pipe (os error 32)".
fn is_print_to_closed_pipe(message: &str) -> bool {
    let epipe = format!("(os error {})", libc::EPIPE);
    message.starts_with("failed printing to stdout") && message.ends_with(&epipe)
}

/// Makes a `println!` into a closed pipe end the process with status 0,
/// quietly; other panics keep the previous hook.
pub(crate) fn install_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if is_print_to_closed_pipe(message) {
            std::process::exit(0);
        }
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_anywhere_in_the_chain_is_a_closed_pipe() {
        let closed = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing the records");
        assert!(is_closed_pipe(&closed));
        let other = anyhow::Error::from(io::Error::from(io::ErrorKind::PermissionDenied))
            .context("writing the records");
        assert!(!is_closed_pipe(&other));
        assert!(!is_closed_pipe(&anyhow::anyhow!("Broken pipe")));
    }

    #[test]
    fn only_the_print_panic_of_a_closed_pipe_is_recognized() {
        let printed = format!(
            "failed printing to stdout: {}",
            io::Error::from_raw_os_error(libc::EPIPE)
        );
        assert!(is_print_to_closed_pipe(&printed), "{printed}");
        let full = format!(
            "failed printing to stdout: {}",
            io::Error::from_raw_os_error(libc::ENOSPC)
        );
        assert!(!is_print_to_closed_pipe(&full), "{full}");
        assert!(!is_print_to_closed_pipe(
            "index out of bounds (os error 32)"
        ));
    }
}
