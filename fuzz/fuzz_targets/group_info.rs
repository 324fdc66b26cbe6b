#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| autopar_fuzz::group_info(data));
