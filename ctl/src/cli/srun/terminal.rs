//! `srun --pty`: the terminal srun runs on, put in raw mode while the
//! step runs (keys, Ctrl-C included, go to the task's terminal as bytes)
//! and given back as it was, and its size.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::termios::{self, SetArg, Termios};

/// Standard input (descriptor 0), for the life of the process.
static STDIN: std::sync::LazyLock<std::io::Stdin> = std::sync::LazyLock::new(std::io::stdin);

fn stdin() -> BorrowedFd<'static> {
    STDIN.as_fd()
}

/// Raw mode on standard input, undone on drop.
pub struct Raw {
    saved: Termios,
}

impl Raw {
    /// `None` when standard input is no terminal (then nothing changes).
    pub fn enter() -> Option<Raw> {
        let fd = stdin();
        let saved = termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw).ok()?;
        Some(Raw { saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

nix::ioctl_read_bad!(tiocgwinsz, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The size of the terminal on standard input: (rows, columns).
#[allow(unsafe_code)]
pub fn size() -> Option<(u16, u16)> {
    use std::os::fd::AsRawFd;
    let mut ws = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points at `ws`, alive for the call.
    unsafe { tiocgwinsz(stdin().as_raw_fd(), &mut ws) }.ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}
