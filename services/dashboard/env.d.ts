// Vite's types for what the bundle imports besides code (the stylesheet).
/// <reference types="vite/client" />
