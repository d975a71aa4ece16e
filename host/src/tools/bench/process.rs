//! What a benchmark run reads of its own process: CPU time and peak RSS.

/// User + system CPU seconds of this process.
pub(super) fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Reset the kernel's peak-RSS mark of this process (Linux).
pub(super) fn reset_peak_rss() {
    reset_peak_rss_in("/proc/self/clear_refs");
}

/// Reset the kernel's peak-RSS mark of another process of this user.
pub(super) fn reset_peak_rss_of(pid: u32) {
    reset_peak_rss_in(&format!("/proc/{pid}/clear_refs"));
}

/// Write "5" (reset the peak) to a /proc clear_refs file; a process that
/// is gone has no peak to reset.
fn reset_peak_rss_in(clear_refs: &str) {
    let _ = std::fs::write(clear_refs, "5");
}

/// Peak resident set since the last reset (KiB), from /proc/self/status.
pub(super) fn peak_rss_kib() -> u64 {
    peak_rss_kib_in("/proc/self/status")
}

/// The `VmHWM` of a /proc status file (KiB).
pub(super) fn peak_rss_kib_in(status: &str) -> u64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
