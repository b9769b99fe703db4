fn main() -> std::process::ExitCode {
    spillway_dwtools::wlm::main()
}
