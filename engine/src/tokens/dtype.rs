//! The integer types a token may be stored as, and their names in the
//! formats that name them (Megatron's dtype codes, numpy's type strings).

use std::fmt;
use std::str::FromStr;

/// A token's stored type: little-endian integers of 1 to 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenDtype {
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `uint16` (vocabularies up to 65,536: GPT-2's, Llama 2's).
    U16,
    /// `int16`.
    I16,
    /// `uint32` (larger vocabularies).
    U32,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint64`.
    U64,
}

/// A `--token-dtype` that is not one of the names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown token dtype {0:?}: expected uint8, int8, uint16, int16, uint32, int32, int64 or uint64")]
pub struct ParseDtypeError(pub String);

impl TokenDtype {
    /// Every dtype, for messages and tests.
    pub const ALL: [TokenDtype; 8] = [
        TokenDtype::U8,
        TokenDtype::I8,
        TokenDtype::U16,
        TokenDtype::I16,
        TokenDtype::U32,
        TokenDtype::I32,
        TokenDtype::I64,
        TokenDtype::U64,
    ];

    /// Bytes of one token.
    pub fn item_bytes(self) -> u64 {
        match self {
            TokenDtype::U8 | TokenDtype::I8 => 1,
            TokenDtype::U16 | TokenDtype::I16 => 2,
            TokenDtype::U32 | TokenDtype::I32 => 4,
            TokenDtype::I64 | TokenDtype::U64 => 8,
        }
    }

    /// Its name (`uint16`), as numpy and the flag spell it.
    pub fn name(self) -> &'static str {
        match self {
            TokenDtype::U8 => "uint8",
            TokenDtype::I8 => "int8",
            TokenDtype::U16 => "uint16",
            TokenDtype::I16 => "int16",
            TokenDtype::U32 => "uint32",
            TokenDtype::I32 => "int32",
            TokenDtype::I64 => "int64",
            TokenDtype::U64 => "uint64",
        }
    }

    /// numpy's little-endian type string (`<u2`), NUL-padded to 8 bytes:
    /// what the ring's header records.
    pub fn typestr(self) -> [u8; 8] {
        let s: &[u8] = match self {
            TokenDtype::U8 => b"|u1",
            TokenDtype::I8 => b"|i1",
            TokenDtype::U16 => b"<u2",
            TokenDtype::I16 => b"<i2",
            TokenDtype::U32 => b"<u4",
            TokenDtype::I32 => b"<i4",
            TokenDtype::I64 => b"<i8",
            TokenDtype::U64 => b"<u8",
        };
        let mut out = [0u8; 8];
        out[..s.len()].copy_from_slice(s);
        out
    }

    /// Megatron-Core's dtype code of an `.idx` file (1 to 8; its
    /// `DType` enum): the integer ones, and None for the floats (6, 7) or
    /// a code it does not have.
    pub fn from_megatron_code(code: u8) -> Option<TokenDtype> {
        match code {
            1 => Some(TokenDtype::U8),
            2 => Some(TokenDtype::I8),
            3 => Some(TokenDtype::I16),
            4 => Some(TokenDtype::I32),
            5 => Some(TokenDtype::I64),
            8 => Some(TokenDtype::U16),
            _ => None,
        }
    }

    /// The dtype numpy names `name` (`uint16`, `int32`, ...), if a token
    /// may be one.
    pub fn from_numpy_name(name: &str) -> Option<TokenDtype> {
        TokenDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The unsigned dtype of `bytes` bytes a token (datatrove's token
    /// size: 2 or 4).
    pub fn unsigned_of(bytes: u64) -> Option<TokenDtype> {
        match bytes {
            1 => Some(TokenDtype::U8),
            2 => Some(TokenDtype::U16),
            4 => Some(TokenDtype::U32),
            8 => Some(TokenDtype::U64),
            _ => None,
        }
    }

    /// Whether `token` fits this dtype (an `--eos-token` must).
    pub fn holds(self, token: u64) -> bool {
        let bits = 8 * self.item_bytes();
        let signed = matches!(
            self,
            TokenDtype::I8 | TokenDtype::I16 | TokenDtype::I32 | TokenDtype::I64
        );
        let max = if signed {
            (1u128 << (bits - 1)) - 1
        } else {
            (1u128 << bits) - 1
        };
        u128::from(token) <= max
    }
}

impl FromStr for TokenDtype {
    type Err = ParseDtypeError;

    fn from_str(s: &str) -> Result<TokenDtype, ParseDtypeError> {
        TokenDtype::from_numpy_name(s).ok_or_else(|| ParseDtypeError(s.to_owned()))
    }
}

impl fmt::Display for TokenDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_codes_are_its_dtype_enum() {
        // megatron/core/datasets/indexed_dataset.py: uint8 = 1, int8 = 2,
        // int16 = 3, int32 = 4, int64 = 5, float64 = 6, float32 = 7, uint16 = 8.
        let named: Vec<Option<&str>> = (1..=8)
            .map(|c| TokenDtype::from_megatron_code(c).map(TokenDtype::name))
            .collect();
        assert_eq!(
            named,
            [
                Some("uint8"),
                Some("int8"),
                Some("int16"),
                Some("int32"),
                Some("int64"),
                None,
                None,
                Some("uint16")
            ]
        );
        assert_eq!(TokenDtype::from_megatron_code(0), None);
        assert_eq!(TokenDtype::from_megatron_code(9), None);
    }

    #[test]
    fn an_eos_token_must_fit_the_dtype() {
        assert!(TokenDtype::U16.holds(65535));
        assert!(!TokenDtype::U16.holds(65536));
        assert!(!TokenDtype::I16.holds(32768));
        assert!(TokenDtype::U64.holds(u64::MAX));
        assert!(!TokenDtype::I64.holds(u64::MAX));
        assert_eq!("uint32".parse::<TokenDtype>(), Ok(TokenDtype::U32));
        assert!("float32".parse::<TokenDtype>().is_err());
    }
}
