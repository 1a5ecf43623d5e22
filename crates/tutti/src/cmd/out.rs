//! Standard output of the commands whose output other programs read (JSON lines, streams):
//! a reader that stops reading (`tutti log stream ... | head`) ends the command quietly, as
//! it ends `cat`, where `println!` would panic. Not for `up`, `chaos` or `bench`, which must
//! stop the processes they started before they exit.

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
