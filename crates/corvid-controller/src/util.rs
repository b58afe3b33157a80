//! Small generators the API needs: UUIDs, MACs, timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // getrandom only fails without any entropy source, where nothing else would work either.
    getrandom::getrandom(&mut b).expect("the kernel's random source");
    b
}

/// A time-ordered (version 7) UUID: IDs made one after another sort together, so their
/// store keys land on the same few pages instead of one page each.
pub fn new_id() -> String {
    let mut b: [u8; 16] = random();
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            id.push('-');
        }
        id.push(HEX[usize::from(x >> 4)] as char);
        id.push(HEX[usize::from(x & 0xf)] as char);
    }
    id
}

/// The MAC numbered `n` (its low 24 bits) in Neutron's `fa:16:3e` range.
pub fn mac_at(n: u32) -> String {
    let b = n.to_be_bytes();
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[1], b[2], b[3])
}

/// A random number below `n` (n > 0).
pub fn random_below(n: u128) -> u128 {
    u128::from_le_bytes(random()) % n
}

/// The current time as Neutron prints it: `2026-11-21T21:00:10Z`.
pub fn now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_macs_and_times_have_their_shapes() {
        let id = new_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "7");
        assert!(id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
        }));
        assert!("89ab".contains(&id[19..20]), "RFC 4122 variant");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(new_id() > id, "time-ordered across milliseconds");
        assert_eq!(mac_at(0x0102_0a0b), "fa:16:3e:02:0a:0b");
        let t = now();
        assert_eq!(t.len(), 20);
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T');
        assert!(t.as_str() > "2025-01-01");
    }
}
