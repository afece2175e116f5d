//! The Cluster slot of a key, as Redis computes it. Part of [`super`].

/// The Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}`, if not empty; else the whole key), modulo 16384.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

/// CRC16, the XMODEM variant Redis Cluster uses.
pub(super) fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}
