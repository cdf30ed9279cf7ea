//! raw-echo: benchmark baseline child — copies each stdin line to stdout, no JSON, flushing only when input drains.

use std::io::{self, BufRead, BufReader, BufWriter, Write};

fn main() -> io::Result<()> {
    let stdin = io::stdin();
    let stdout = io::stdout();
    let mut reader = BufReader::with_capacity(64 * 1024, stdin.lock());
    let mut writer = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut line = Vec::with_capacity(4096);
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        writer.write_all(&line)?;
        // Same rule as plugd-sdk: one write per burst, never a reply held back
        // while the host waits.
        if reader.buffer().is_empty() {
            writer.flush()?;
        }
    }
    writer.flush()
}
