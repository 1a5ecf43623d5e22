//! Standard output of the commands: a reader that stops reading (`tutti log stream ... |
//! head`) ends a command that only prints quietly, as it ends `cat`, where `println!` would
//! panic; `up`, `chaos` and `bench`, which must stop the processes they started before they
//! exit, go on without their output instead.

use std::io::Write;

/// Writes `text` and a newline to stdout. A closed pipe ends the process with status 0; any
/// other failure to write ends it with status 1.
pub(crate) fn line(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("tutti: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cmd::out::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes `text` and a newline to stdout if it can: a reader gone must not stop a command
/// that has processes to stop before it exits.
pub(crate) fn line_if_read(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}").and_then(|()| stdout.flush());
}

/// `println!` through [`line_if_read`].
macro_rules! noteln {
    ($($arg:tt)*) => {
        $crate::cmd::out::line_if_read(format_args!($($arg)*))
    };
}
pub(crate) use noteln;
