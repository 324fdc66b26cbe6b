//! Element types and their names in both formats (MindSpore `str(mstype)` and safetensors codes).

use std::fmt;

/// The element type of a checkpoint tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// Boolean, one byte.
    Bool,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    UInt8,
    /// Unsigned 16-bit integer.
    UInt16,
    /// Unsigned 32-bit integer.
    UInt32,
    /// Unsigned 64-bit integer.
    UInt64,
    /// IEEE half precision (`float16`).
    Float16,
    /// Brain floating point (`bfloat16`).
    BFloat16,
    /// IEEE single precision (`float32`).
    Float32,
    /// IEEE double precision (`float64`).
    Float64,
    /// MindSpore string values (`tensor_type = "str"`): UTF-32LE, 4 bytes per character.
    Str,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float16,
        DType::BFloat16,
        DType::Float32,
        DType::Float64,
        DType::Str,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::Int8 | DType::UInt8 => 1,
            DType::Int16 | DType::UInt16 | DType::Float16 | DType::BFloat16 => 2,
            DType::Int32 | DType::UInt32 | DType::Float32 | DType::Str => 4,
            DType::Int64 | DType::UInt64 | DType::Float64 => 8,
        }
    }

    /// MindSpore's `tensor_type` string in `.ckpt` files.
    pub fn mindspore_name(self) -> &'static str {
        match self {
            DType::Bool => "Bool",
            DType::Int8 => "Int8",
            DType::Int16 => "Int16",
            DType::Int32 => "Int32",
            DType::Int64 => "Int64",
            DType::UInt8 => "UInt8",
            DType::UInt16 => "UInt16",
            DType::UInt32 => "UInt32",
            DType::UInt64 => "UInt64",
            DType::Float16 => "Float16",
            DType::BFloat16 => "BFloat16",
            DType::Float32 => "Float32",
            DType::Float64 => "Float64",
            DType::Str => "str",
        }
    }

    /// The element type with MindSpore's `tensor_type` name `name`, if any.
    pub fn from_mindspore(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.mindspore_name() == name)
    }

    /// The safetensors dtype code; `None` for strings, which safetensors cannot hold.
    pub fn safetensors_name(self) -> Option<&'static str> {
        Some(match self {
            DType::Bool => "BOOL",
            DType::Int8 => "I8",
            DType::Int16 => "I16",
            DType::Int32 => "I32",
            DType::Int64 => "I64",
            DType::UInt8 => "U8",
            DType::UInt16 => "U16",
            DType::UInt32 => "U32",
            DType::UInt64 => "U64",
            DType::Float16 => "F16",
            DType::BFloat16 => "BF16",
            DType::Float32 => "F32",
            DType::Float64 => "F64",
            DType::Str => return None,
        })
    }

    /// The element type with safetensors dtype code `name`, if any.
    pub fn from_safetensors(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.safetensors_name() == Some(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mindspore_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_both_names() {
        for d in DType::ALL {
            assert_eq!(DType::from_mindspore(d.mindspore_name()), Some(d));
            if let Some(s) = d.safetensors_name() {
                assert_eq!(DType::from_safetensors(s), Some(d));
            }
        }
        assert_eq!(DType::from_mindspore("Int4"), None);
        assert_eq!(DType::from_safetensors("F8_E4M3"), None);
        assert_eq!(DType::BFloat16.size(), 2);
    }
}
