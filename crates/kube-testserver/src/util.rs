//! Small helpers: timestamps, identifiers, JSON access.

use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};

/// Current time as RFC 3339 with second precision, like metav1.Time.
pub fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

static SEED: AtomicU64 = AtomicU64::new(0);

fn next_random() -> u64 {
    let base = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let t = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0) as u64;
    let mut x = base ^ t ^ (std::process::id() as u64).rotate_left(32);
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A random version-4 UUID string.
pub fn uuid() -> String {
    let a = next_random();
    let b = next_random();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Five random characters from kube's generateName alphabet.
pub fn name_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = next_random();
    (0..5)
        .map(|_| {
            let c = ALPHA[(r % ALPHA.len() as u64) as usize] as char;
            r /= ALPHA.len() as u64;
            c
        })
        .collect()
}

/// String at a JSON pointer, or "".
pub fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Human-readable age like kube's duration.HumanDuration.
pub fn human_age(ts: &str) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return "<invalid>".into();
    };
    let d = chrono::Utc::now().signed_duration_since(t).num_seconds();
    human_duration(d)
}

/// Formats seconds like kube's duration.HumanDuration.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rs}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rm}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let rh = h % 24;
        return if rh == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{rh}h", h / 24)
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    format!("{}y", h / 24 / 365)
}
